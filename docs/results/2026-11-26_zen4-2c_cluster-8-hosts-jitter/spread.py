# Ran with the code of commit 71fdef765; it imports ddp_lab internals that have moved or gone since,
# so it runs at that commit only: git worktree add /tmp/ddp_lab-71fdef765 71fdef765
"""Does a pairwise exchange's time spread more when the other hosts are busy? 8 ranks, one per
host; the pairs (r, r+4) exchange 2 MiB each way, as halving-doubling's first step does. Each
exchange starts with a 4-byte exchange, so both partners post the 2 MiB together; its time is
from the post to the arrival of the partner's 2 MiB. Phases, two rounds each, 100 exchanges:
`alone`: only ranks 0 and 4 exchange while the others wait; `all`: the four pairs at once.
Rank 0 prints the median and spread of its pair's exchange times per phase.

    python -m ddp_lab.cluster run -- docs/results/2026-11-26_zen4-2c_cluster-8-hosts-jitter/spread.py
"""
import statistics
import time

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from ddp_lab import tuning
from ddp_lab.collectives.p2p import comm_of

EXCHANGES, BYTES = 100, 2 << 20
env = tuning.start(OmegaConf.create({"backend": "gloo", "device": "cpu", "timeout_s": 300, "comm_threads": "auto"}))
rank, n = dist.get_rank(), dist.get_world_size()
assert n == 8, "spread.py wants 8 hosts x 1 rank"
comm = comm_of(None, False)
peer = rank ^ 4
send, recv = torch.ones(BYTES // 4), torch.empty(BYTES // 4)
tick_out, tick_in = torch.ones(1), torch.empty(1)


def exchange() -> float:
    """One 2 MiB exchange with the peer, both posted together; ms until the peer's data is here."""
    w = comm.irecv(tick_in, peer, 1)
    comm.isend(tick_out, peer, 1).wait()
    w.wait()
    t0 = time.perf_counter()
    w = comm.irecv(recv, peer, 2)
    s = comm.isend(send, peer, 2)
    w.wait()
    ms = (time.perf_counter() - t0) * 1e3
    s.wait()
    return ms


def line(phase: str, ms: list[float]) -> str:
    q = statistics.quantiles(ms, n=10)
    return (f"{phase:6s} median {statistics.median(ms):6.2f} ms  p10 {q[0]:6.2f}  p90 {q[-1]:6.2f}  "
            f"max {max(ms):6.2f}  p90-p10 {q[-1] - q[0]:5.2f}")


ideal = BYTES / (125e6 * 0.956) * 1e3
with tuning.at_comm_priority(env.comm_threads == "realtime"):
    for _ in range(3):  # warm the connections
        exchange()
    dist.barrier()
    for round_ in (1, 2):
        for phase in ("alone", "all"):
            active = phase == "all" or rank in (0, 4)
            ms = [exchange() for _ in range(EXCHANGES)] if active else []
            dist.barrier()
            if rank == 0:
                print(f"round {round_} {line(phase, ms)}  (2 MiB at TCP's payload rate: {ideal:.2f})", flush=True)
dist.destroy_process_group()
