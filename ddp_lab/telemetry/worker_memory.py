"""The memory a rank's DataLoader workers hold: what a host's memory limit counts beside the rank itself.

A worker is forked from its rank: the pages it shares with the rank are the rank's; those it writes (its
batches, the reference counts of the Python objects it touches) become its own. So a worker's memory is its
private pages (Private_Clean + Private_Dirty of /proc/<pid>/smaps_rollup). Reading that walks the process's
whole map (about 10 ms a worker), so the trainer samples at each epoch's end and at the run's, not each step;
the largest sum over the rank's workers is the figure (summary.json's loader_workers_mb_by_rank), beside
what the fit check priced (training/memory_estimate.py's WORKER_BYTES a worker).
"""
from __future__ import annotations

from typing import Callable

PRIVATE = ("Private_Clean:", "Private_Dirty:")


def private_bytes(pid: int) -> int:
    """The pages process `pid` holds alone, in bytes; 0 where it is gone or not readable (no /proc)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return sum(int(line.split()[1]) * 1024 for line in f if line.startswith(PRIVATE))
    except (OSError, ValueError, IndexError):
        return 0


class WorkerMemory:
    """The largest private memory a rank's DataLoader workers held together, at the moments sampled."""

    def __init__(self, pids: Callable[[], list[int]]):
        self.pids = pids  # the workers running now (started lazily, with the loader's first batch)
        self.peak_bytes = 0

    def sample(self) -> int:
        """Measure now; the workers' bytes now."""
        now = sum(private_bytes(p) for p in self.pids())
        self.peak_bytes = max(self.peak_bytes, now)
        return now
