"""The ring all-reduce as the textbook writes it (Patarasuk & Yuan 2009).

The n ranks form a ring and the data is cut into n chunks.

* Reduce-scatter, n-1 steps: in step s, rank r sends chunk r-s to its right
  neighbour and receives chunk r-s-1 from its left one, which it adds into
  its own copy. What a rank sends in one step is what it finished adding in
  the step before, so after n-1 steps rank r holds the full sum of chunk r+1.
* All-gather, n-1 steps: the summed chunks go once more around the ring,
  each received straight into place.

Every rank sends 2(n-1) messages of N/n bytes:
2(n-1)*alpha + 2(n-1)/n*N*beta + (n-1)/n*N*gamma. The bandwidth term does
not grow with n, the latency term does: the algorithm for large messages.
ring.py is the same algorithm tuned for speed.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.collectives.basics import chunk_bounds, run_textbook, sendrecv


def _ring(flat: torch.Tensor, rank: int, n: int, group: dist.ProcessGroup | None) -> None:
    bounds = chunk_bounds(flat.numel(), n)

    def chunk(c: int) -> torch.Tensor:
        c %= n
        return flat[bounds[c]:bounds[c + 1]]

    right, left = (rank + 1) % n, (rank - 1) % n
    incoming = torch.empty_like(chunk(0))  # chunk 0 is the largest
    for s in range(n - 1):  # reduce-scatter
        mine = chunk(rank - s - 1)
        received = incoming[:mine.numel()]
        sendrecv(chunk(rank - s), right, received, left, group)
        mine.add_(received)
    for s in range(n - 1):  # all-gather
        sendrecv(chunk(rank + 1 - s), right, chunk(rank - s), left, group)


def ring_textbook_allreduce(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Ring reduce-scatter + all-gather, one message per chunk and step."""
    return run_textbook(tensor, group, _ring)
