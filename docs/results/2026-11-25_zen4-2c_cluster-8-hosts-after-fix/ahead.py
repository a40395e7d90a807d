# Ran with the code of commit 58386eafa; it imports ddp_lab internals that have moved or gone since,
# so it runs at that commit only: git worktree add /tmp/ddp_lab-58386eafa 58386eafa
"""Halving-doubling as shipped against a variant, beside gloo's all-reduce and
the ring, in shuffled interleaved rounds. Run by run.sh in this folder (8
hosts, 1 Gbit/s; BYTES, RATE_BPS, ROUNDS, CALLS and AHEAD from the
environment).

"hd ahead 1": as shipped, each step's receive is posted just before its send
(pairwise.run_steps, each_step=True); here the next AHEAD (1) steps'
receives are posted too, so that a partner already done with the step
under way can send into a rank still busy with it.
"""
import os
import random
import statistics
import time

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from ddp_lab import tuning
from ddp_lab.collectives.halving_doubling import _prepare_halving_doubling, halving_doubling_allreduce
from ddp_lab.collectives.p2p import comm_of, wait_all
from ddp_lab.collectives.ring import ring_allreduce

env = tuning.start(OmegaConf.create({"backend": "gloo", "device": "cpu", "timeout_s": 300, "comm_threads": "auto"}))
rank, n = dist.get_rank(), dist.get_world_size()
rate = float(os.environ["RATE_BPS"]) / 8
numel = int(os.environ.get("BYTES", 4 << 20)) // 4
AHEAD = int(os.environ.get("AHEAD", 1))
x = torch.ones(numel)
plan = tuning.plan_for(env)
rt = env.comm_threads == "realtime"
comm = comm_of(None, False)
STEPS, EARLY = _prepare_halving_doubling(x, comm, plan)
assert EARLY


def ahead():
    recv = [None] * len(STEPS)
    sends = []

    def post(j):
        if j < len(STEPS) and recv[j] is None and STEPS[j].recv is not None:
            recv[j] = comm.irecv(STEPS[j].recv, STEPS[j].peer, STEPS[j].tag)

    for i, st in enumerate(STEPS):
        for j in range(i, i + AHEAD + 1):
            post(j)
        if st.send is not None:
            sends.append(comm.isend(st.send, st.peer, st.tag))
        if recv[i] is not None:
            recv[i].wait()
        if st.add_into is not None:
            st.add_into.add_(st.recv)
    wait_all(sends)


variants = {"gloo": lambda: dist.all_reduce(x), "ring": lambda: ring_allreduce(x, None, plan),
            "hd shipped": lambda: halving_doubling_allreduce(x, None, plan), f"hd ahead {AHEAD}": ahead}
for name, fn in variants.items():
    x.fill_(rank + 1)
    with tuning.at_comm_priority(rt):
        fn()
    assert torch.equal(x, torch.full_like(x, n * (n + 1) / 2)), name
times = {k: [] for k in variants}
rng = random.Random(0)
CALLS = int(os.environ.get("CALLS", 5))
for _ in range(int(os.environ.get("ROUNDS", 7))):
    order = list(variants)
    rng.shuffle(order)
    for k in order:
        with tuning.at_comm_priority(rt):
            variants[k]()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(CALLS):
                variants[k]()
            dist.barrier()
        times[k].append((time.perf_counter() - t0) / CALLS)
if rank == 0:
    print(f"{n} hosts, {numel * 4 >> 20} MiB, comm_threads={env.comm_threads}; median of "
          f"{len(times['gloo'])} rounds ({CALLS} calls and a barrier each), busbw over the link")
    for k, ts in times.items():
        med = statistics.median(ts)
        print(f"{k:14s} {med * 1e3:7.1f} ms  busbw/link {2 * (n - 1) / n * numel * 4 / med / rate:.3f}  "
              f"range {min(ts) * 1e3:.1f}-{max(ts) * 1e3:.1f} ms", flush=True)
dist.destroy_process_group()
