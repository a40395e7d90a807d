"""The textbook scheme: everyone sends to group rank 0, which adds and sends
the sum back ("sum on device 0, copy back").

The root handles every byte: 2(n-1)*(alpha + N*beta) + (n-1)*N*gamma at the
root, so it gets slower linearly with n.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.collectives.tuned.p2p import Comm, run_on_comm_device, scratch, wait_all
from ddp_lab.collectives.tuned.pairwise import Step, receives_first, run_steps
from ddp_lab.collectives.tuned.plan import DEFAULT_PLAN, TunedPlan

_TAG_GATHER = 101
_TAG_BCAST = 102


def _naive(flat: torch.Tensor, comm: Comm, plan: TunedPlan) -> None:
    n, rank = comm.size, comm.rank
    if rank != 0:
        # Receiving the result into `flat` while it is being sent is safe:
        # the root only replies once it has received everything.
        run_steps(comm, [Step(0, _TAG_GATHER, send=flat, recv=None),
                         Step(0, _TAG_BCAST, send=None, recv=flat)],
                  receives_first=receives_first(flat, comm, plan))
        return
    # Root: two scratch buffers (one if there is a single sender), so the
    # message from rank i+1 is arriving while the one from rank i is added.
    slots = min(2, n - 1)
    buf = scratch(slots * flat.numel(), flat)
    incoming = [buf[i * flat.numel(): (i + 1) * flat.numel()] for i in range(slots)]
    pending, _ = comm.exchange((incoming[0], 1), None, _TAG_GATHER)
    for src in range(1, n):
        wait_all(pending)
        if src + 1 < n:
            nxt = incoming[src % slots]
            pending, _ = comm.exchange((nxt, src + 1), None, _TAG_GATHER)
        flat.add_(incoming[(src - 1) % slots])
    sends = []
    for dst in range(1, n):
        recv_works, send_works = comm.exchange(None, (flat, dst), _TAG_BCAST)
        sends += recv_works + send_works
    wait_all(sends)


def naive_allreduce(tensor: torch.Tensor, group: dist.ProcessGroup | None = None,
                    plan: TunedPlan = DEFAULT_PLAN) -> torch.Tensor:
    """Gather to group rank 0, add there, send the sum back to everyone."""
    return run_on_comm_device(tensor, group, plan, _naive)
