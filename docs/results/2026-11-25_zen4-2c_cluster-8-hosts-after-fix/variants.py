# Ran with the code of commit 58386eafa; it imports ddp_lab internals that have moved or gone since,
# so it runs at that commit only: git worktree add /tmp/ddp_lab-58386eafa 58386eafa
"""Halving-doubling as shipped against one variant, beside gloo's all-reduce
and the ring, in shuffled interleaved rounds. Run by run.sh in this folder
(8 hosts, 1 Gbit/s; BYTES, RATE_BPS and ROUNDS from the environment).

"hd pipe": each reduce-scatter step in two messages, the half this rank sends
at the next step first. Only that half is added before the next step's
send; the other half is added while the next step's data arrives. So a
step waits for half an addition, not a whole one (timeline/summary.txt: up
to 0.7 ms for 2 MiB with 8 ranks on 2 cores).
"""
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
from ddp_lab.collectives.ring import ring_allreduce

env = tuning.start(OmegaConf.create({"backend": "gloo", "device": "cpu", "timeout_s": 300, "comm_threads": "auto"}))
rank, n = dist.get_rank(), dist.get_world_size()
assert n & (n - 1) == 0, "the variant is written for a power-of-two world"
rate = float(os.environ["RATE_BPS"]) / 8
numel = int(os.environ.get("BYTES", 4 << 20)) // 4
x = torch.ones(numel)
plan = tuning.plan_for(env)
comm = comm_of(None, False)
L = n.bit_length() - 1
BOUNDS = chunk_bounds(numel, n)


def split(win, level):
    """(give, keep) halves of a window of chunks at `level`, as this rank splits it."""
    a, b = win
    m = (a + b) // 2
    return ((a, m), (m, b)) if rank & (n >> (level + 1)) else ((m, b), (a, m))


def elements(w):
    return slice(BOUNDS[w[0]], BOUNDS[w[1]])


def halves(w):
    a, b = BOUNDS[w[0]], BOUNDS[w[1]]
    return slice(a, (a + b) // 2), slice((a + b) // 2, b)


def pipe_plan():
    """Per reduce-scatter level: (partner, the two pieces received, the two sent)."""
    win, levels = (0, n), []
    for level in range(L):
        give, keep = split(win, level)
        if level < L - 1:  # the piece the next level sends goes first
            got = tuple(elements(w) for w in split(keep, level + 1))
            sent = tuple(elements(w) for w in split(give, level + 1))
        else:
            got, sent = halves(keep), halves(give)
        levels.append((rank ^ (n >> (level + 1)), got, sent))
        win = keep
    space = [[torch.empty(s.stop - s.start) for s in got] for _, got, _ in levels]
    gather = [s for s in _prepare_halving_doubling(x, comm, plan)[0] if s.add_into is None]
    return levels, space, gather


LEVELS, SPACE, GATHER = pipe_plan()


def pipe():
    sends, deferred = [], None
    for level, (peer, got, sent) in enumerate(LEVELS):
        works = [comm.irecv(SPACE[level][j], peer, 500 + 2 * level + j) for j in range(2)]
        sends += [comm.isend(x[sent[j]], peer, 500 + 2 * level + j) for j in range(2)]
        if deferred is not None:  # the previous level's second piece, while this level's data arrive
            work, into, buf = deferred
            work.wait()
            x[into].add_(buf)
        works[0].wait()
        x[got[0]].add_(SPACE[level][0])
        deferred = (works[1], got[1], SPACE[level][1])
    work, into, buf = deferred
    work.wait()
    x[into].add_(buf)
    for st in GATHER:  # the all-gather as shipped: each step's receive posted just before its send
        work = comm.irecv(st.recv, st.peer, st.tag)
        sends.append(comm.isend(st.send, st.peer, st.tag))
        work.wait()
    wait_all(sends)


variants = {"gloo": lambda: dist.all_reduce(x), "ring": lambda: ring_allreduce(x, None, plan),
            "hd shipped": lambda: halving_doubling_allreduce(x, None, plan), "hd pipe": pipe}
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
        print(f"{k:12s} {med * 1e3:7.1f} ms  busbw/link {2 * (n - 1) / n * numel * 4 / med / rate:.3f}  "
              f"range {min(ts) * 1e3:.1f}-{max(ts) * 1e3:.1f} ms")
dist.destroy_process_group()
