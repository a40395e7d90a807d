# Ran with the code of commit 0c3ef9a5d; it imports ddp_lab internals that have moved or gone since,
# so it runs at that commit only: git worktree add /tmp/ddp_lab-0c3ef9a5d 0c3ef9a5d
"""The ring and halving-doubling across emulated hosts, as shipped and as
variants, in shuffled interleaved rounds beside gloo's all-reduce. Run by
run.sh in this folder (8 hosts, 1 Gbit/s).

The ring: "ring chunks whole" sends each chunk as one message (the plan for
one host, where a message saved beats overlap); "ring 128K" cuts chunks in
128 KiB segments; shipped, across hosts, a chunk of 512 KiB or more goes in
at least two segments.

Halving-doubling (the same steps as halving_doubling._prepare_halving_doubling):
* ahead N: each step's receive posted N steps before its send (shipped: 0);
  "ahead 9" posts every receive at once.
* pieces K: each reduce-scatter step cut in K messages, each added as it
  arrives, so the addition overlaps the rest of the transfer.
* channels C: the buffer cut in C parts, each its own halving-doubling, their
  steps interleaved so that one part's transfers fill another's waits.
"""
import dataclasses
import os
import random
import statistics
import time

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from ddp_lab import tuning
from ddp_lab.collectives.basics import chunk_bounds
from ddp_lab.collectives.halving_doubling import _prepare_halving_doubling, halving_doubling_allreduce
from ddp_lab.collectives.p2p import comm_of, wait_all
from ddp_lab.collectives.pairwise import Step
from ddp_lab.collectives.ring import ring_allreduce

env = tuning.start(OmegaConf.create({"backend": "gloo", "device": "cpu", "timeout_s": 300, "comm_threads": "auto"}))
rank, n = dist.get_rank(), dist.get_world_size()
rate = float(os.environ["RATE_BPS"]) / 8
numel = int(os.environ.get("BYTES", 4 << 20)) // 4
x = torch.ones(numel)
plan = tuning.plan_for(env)
comm = comm_of(None, False)


def post(st, sends):
    work = comm.irecv(st.recv, st.peer, st.tag) if st.recv is not None else None
    if st.send is not None:
        sends.append(comm.isend(st.send, st.peer, st.tag))
    return work


def finish(st, work):
    if work is not None:
        work.wait()
    if st.add_into is not None:
        st.add_into.add_(st.recv)


def own_scratch(steps, tag_base):
    """The steps with receive buffers of their own (the parts' steps would share one)."""
    return [Step(s.peer, s.tag + tag_base, s.send, torch.empty_like(s.recv) if s.add_into is not None else s.recv,
                 s.add_into) for s in steps]


STEPS = own_scratch(_prepare_halving_doubling(x, comm, plan)[0], 0)


def ahead(k):
    sends, works = [], [None] * len(STEPS)
    posted = 0
    for i, st in enumerate(STEPS):
        while posted <= min(i + k, len(STEPS) - 1):  # receives up to step i + k
            s = STEPS[posted]
            works[posted] = comm.irecv(s.recv, s.peer, s.tag) if s.recv is not None else None
            posted += 1
        if st.send is not None:
            sends.append(comm.isend(st.send, st.peer, st.tag))
        finish(st, works[i])
    wait_all(sends)


def cut(st, k):
    if st.add_into is None:
        return [st]
    b = chunk_bounds(st.send.numel(), k)
    return [Step(st.peer, st.tag * 16 + j, st.send[b[j]:b[j + 1]], st.recv[b[j]:b[j + 1]],
                 st.add_into[b[j]:b[j + 1]]) for j in range(k)]


def pieces(k):
    sends = []
    for st in STEPS:
        parts = cut(st, k)
        works = [comm.irecv(p.recv, p.peer, p.tag) for p in parts]
        for p in parts:
            sends.append(comm.isend(p.send, p.peer, p.tag))
        for p, w in zip(parts, works):
            finish(p, w)
    wait_all(sends)


def parts(c):
    b = chunk_bounds(numel, c)
    return [own_scratch(_prepare_halving_doubling(x[b[i]:b[i + 1]], comm, plan)[0], 1000 * (i + 1))
            for i in range(c)]


def channels(chs):
    sends, works = [], {}
    for c in range(len(chs)):
        works[c, 0] = post(chs[c][0], sends)
    for i in range(len(chs[0])):
        for c in range(len(chs)):
            finish(chs[c][i], works.pop((c, i)))
            if i + 1 < len(chs[c]):
                works[c, i + 1] = post(chs[c][i + 1], sends)
    wait_all(sends)


variants = {"gloo": lambda: dist.all_reduce(x), "ring": lambda: ring_allreduce(x, None, plan),
            "ring chunks whole": lambda: ring_allreduce(x, None, dataclasses.replace(plan, across_hosts=False)),
            "ring 128K": lambda: ring_allreduce(x, None, dataclasses.replace(plan, segment_bytes=128 << 10)),
            "hd shipped": lambda: halving_doubling_allreduce(x, None, plan)}
for k in (0, 1, 9):
    variants[f"hd ahead {k}"] = lambda k=k: ahead(k)
variants["hd pieces 2"] = lambda: pieces(2)
for c in (2, 3):
    variants[f"hd channels {c}"] = lambda chs=parts(c): channels(chs)

for name, fn in variants.items():  # each sums right before it is timed
    x.fill_(rank + 1)
    with tuning.at_comm_priority(env.comm_threads == "realtime"):
        fn()
    assert torch.equal(x, torch.full_like(x, n * (n + 1) / 2)), name

times = {k: [] for k in variants}
rng = random.Random(0)
for _ in range(int(os.environ.get("ROUNDS", 7))):
    order = list(variants)
    rng.shuffle(order)
    for k in order:
        with tuning.at_comm_priority(env.comm_threads == "realtime"):
            variants[k]()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(3):
                variants[k]()
            dist.barrier()
        times[k].append((time.perf_counter() - t0) / 3)
if rank == 0:
    print(f"{n} hosts, {numel * 4 >> 20} MiB, comm_threads={env.comm_threads}; median of "
          f"{len(times['gloo'])} rounds (3 calls and a barrier each), busbw over the link")
    for k, ts in times.items():
        med = statistics.median(ts)
        print(f"{k:16s} {med * 1e3:7.1f} ms  busbw/link {2 * (n - 1) / n * numel * 4 / med / rate:.3f}  "
              f"range {min(ts) * 1e3:.1f}-{max(ts) * 1e3:.1f} ms")
dist.destroy_process_group()
