# Ran with the code of commit 58386eafa; it imports ddp_lab internals that have moved or gone since,
# so it runs at that commit only: git worktree add /tmp/ddp_lab-58386eafa 58386eafa
"""Halving-doubling as shipped against a variant, beside gloo's all-reduce and
the ring, in shuffled interleaved rounds. Run by run.sh in this folder (8
hosts, 1 Gbit/s; BYTES, RATE_BPS, ROUNDS, CALLS and SEGS from the
environment).

"hd 2 threads": the buffer in SEGS parts (2), each all-reduced by
halving-doubling as shipped, in a thread of its own and with tags of its own,
so that while one part's step waits for a late partner the other part's
data can keep the link busy (the timeline: the median rank never waits, but
some rank waits at every step, and a pairwise step ends when its later
partner is ready).
"""
import os
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from ddp_lab import tuning
from ddp_lab.collectives.halving_doubling import _prepare_halving_doubling, halving_doubling_allreduce
from ddp_lab.collectives.p2p import comm_of
from ddp_lab.collectives.pairwise import run_steps
from ddp_lab.collectives.ring import ring_allreduce

env = tuning.start(OmegaConf.create({"backend": "gloo", "device": "cpu", "timeout_s": 300, "comm_threads": "auto"}))
rank, n = dist.get_rank(), dist.get_world_size()
rate = float(os.environ["RATE_BPS"]) / 8
numel = int(os.environ.get("BYTES", 4 << 20)) // 4
SEGS = int(os.environ.get("SEGS", 2))
x = torch.ones(numel)
plan = tuning.plan_for(env)
pool = ThreadPoolExecutor(SEGS - 1)
rt = env.comm_threads == "realtime"
_steps = {}


def seg_run(j):
    """Part j all-reduced by halving-doubling's steps, their tags moved by 1000 j."""
    with tuning.at_comm_priority(rt):  # this thread's own priority, as the caller's
        key = j
        if key not in _steps:
            comm = comm_of(None, False)
            part = x.chunk(SEGS)[j]
            steps, early = _prepare_halving_doubling(part, comm, plan)
            _steps[key] = (comm, [s._replace(tag=s.tag + 1000 * j) for s in steps], early)
        comm, steps, early = _steps[key]
        run_steps(comm, steps, early, each_step=True)


def parts():
    futs = [pool.submit(seg_run, j) for j in range(1, SEGS)]
    seg_run(0)
    for f in futs:
        f.result()


variants = {"gloo": lambda: dist.all_reduce(x), "ring": lambda: ring_allreduce(x, None, plan),
            "hd shipped": lambda: halving_doubling_allreduce(x, None, plan), f"hd {SEGS} threads": parts}
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
