"""TunedPlan: what ddp_lab.tuning tells the tuned all-reduces about the machine."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TunedPlan:
    """What the tuned all-reduces are told about the machine they run on.

    ddp_lab.tuning decides it once at start-up and the caller hands it in
    (`get_algorithm(name, plan)`); tests pass their own. NCCL ignores it.
    """

    # Whether gloo's threads run at real-time priority (dist.comm_threads). It
    # sets what a message costs, and so how the ring cuts its chunks
    # (ring.ring_plan) and the order in which pairwise exchanges post their
    # messages (pairwise.receives_first). The caller then runs each call with
    # its own thread at the same priority (ddp_lab.tuning.gloo_threads.at_comm_priority).
    realtime_threads: bool = False
    # Whether the ranks are on more than one host, with a network between them.
    # A link carries data both ways at once only if each side's receive is
    # posted before the other's send arrives: then exchanges with one peer
    # post their receives first (pairwise.receives_first, ring.ring_plan).
    across_hosts: bool = False
    # The ring's segment size in bytes; None: by realtime_threads (ring.SEGMENT_BYTES).
    segment_bytes: int | None = None
    # Upper bound on the ring's receive scratch space on the host (see ring._prepare_ring).
    max_scratch_bytes: int = 256 * 1024 * 1024


DEFAULT_PLAN = TunedPlan()  # gloo's threads at normal priority
