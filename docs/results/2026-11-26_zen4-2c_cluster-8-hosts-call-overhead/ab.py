# Ran with the code of commit f06df527b; it imports ddp_lab internals that have moved or gone since,
# so it runs at that commit only: git worktree add /tmp/ddp_lab-f06df527b f06df527b
"""What the shipped all-reduce call costs around its steps, on 8 emulated hosts (4 MiB).

Blocks of 20 calls after a barrier, timed as bench.collectives times them
(the slowest rank's mean per call), in shuffled rounds of five ways:

  hd-shipped    halving-doubling as training and bench.collectives call it
                (tuning.allreduce: the thread raised to real-time priority for
                each call and back to normal after it)
  hd-held       the same function, the thread's priority held over the whole block
  hd-hand       the after-fix record's timeline.py loop over the same prepared
                steps (irecv, isend, wait, add), no timestamps, priority held
  ring-shipped  the ring as training calls it
  ring-held     the ring, priority held over the block

Run with `python -m ddp_lab.cluster run -- ab.py` (ROUNDS, SEED from the environment).
"""
import os
import random
import statistics
import time

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from ddp_lab import tuning
from ddp_lab.collectives import get_algorithm
from ddp_lab.collectives.halving_doubling import _prepare_halving_doubling
from ddp_lab.collectives.p2p import comm_of, wait_all
from ddp_lab.gloo_threads import at_comm_priority

env = tuning.start(OmegaConf.create({"backend": "gloo", "device": "cpu", "timeout_s": 300, "comm_threads": "auto"}))
rank, n = dist.get_rank(), dist.get_world_size()
plan = tuning.plan_for(env)
x = torch.ones(1 << 20)
comm = comm_of(None, False)
steps, _ = _prepare_halving_doubling(x, comm, plan)


def hand(_):
    sends = []
    for st in steps:
        w = comm.irecv(st.recv, st.peer, st.tag) if st.recv is not None else None
        if st.send is not None:
            sends.append(comm.isend(st.send, st.peer, st.tag))
        if w is not None:
            w.wait()
        if st.add_into is not None:
            st.add_into.add_(st.recv)
    wait_all(sends)


WAYS = {  # name: (function, hold the priority over the block)
    "hd-shipped": (tuning.allreduce("halving_doubling", env), False),
    "hd-held": (get_algorithm("halving_doubling", plan), True),
    "hd-hand": (hand, True),
    "ring-shipped": (tuning.allreduce("ring", env), False),
    "ring-held": (get_algorithm("ring", plan), True),
}


def block(name: str, calls: int = 20) -> float:
    fn, held = WAYS[name]
    dist.barrier()
    t0 = time.perf_counter()
    with at_comm_priority(held and env.comm_threads == "realtime"):
        for _ in range(calls):
            fn(x)
    t = torch.tensor([(time.perf_counter() - t0) / calls])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


for name in WAYS:
    block(name, calls=5)  # warm-up
res = {name: [] for name in WAYS}
rng = random.Random(int(os.environ.get("SEED", 0)))
for _ in range(int(os.environ.get("ROUNDS", 10))):
    order = list(WAYS)
    rng.shuffle(order)
    for name in order:
        res[name].append(block(name))
if rank == 0:
    bus = 2 * (n - 1) / n * x.numel() * x.element_size()
    print(f"{n} ranks, {x.numel() * 4 >> 20} MiB, comm_threads={env.comm_threads}; busbw over 1 Gbit/s per block:")
    for name, ts in res.items():
        xs = [bus / t / 125e6 for t in ts]
        print(f"{name:>13}: median {statistics.median(xs):.1%}, range {min(xs):.1%}-{max(xs):.1%}  "
              f"({' '.join(f'{a:.3f}' for a in xs)})")
dist.destroy_process_group()
