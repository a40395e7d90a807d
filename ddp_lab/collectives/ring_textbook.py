"""The ring all-reduce as the textbook writes it (Patarasuk & Yuan 2009), and its two
phases on their own: the reduce-scatter and the all-gather that sharded data
parallelism (ZeRO, FSDP) is made of.

The n ranks form a ring and the data is cut into n chunks (basics.chunk_bounds);
rank r owns chunk r.

* Reduce-scatter, n-1 steps: in step s, rank r sends chunk r-s-1 to its right
  neighbour and receives chunk r-s-2 from its left one, which it adds into its
  own copy. What a rank sends in one step is what it finished adding in the
  step before, so after n-1 steps rank r holds the full sum of its chunk r
  (the other chunks hold partial sums). (n-1)*alpha + (n-1)/n*N*beta +
  (n-1)/n*N*gamma.
* All-gather, n-1 steps: each rank's chunk goes once around the ring, received
  straight into place. (n-1)*alpha + (n-1)/n*N*beta.

The all-reduce is one then the other: every rank sends 2(n-1) messages of N/n
bytes, 2(n-1)*alpha + 2(n-1)/n*N*beta + (n-1)/n*N*gamma. The bandwidth term does
not grow with n, the latency term does: the algorithm for large messages.
ring.py is the same all-reduce tuned for speed.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.collectives.basics import chunk_bounds, group_rank, run_textbook, sendrecv


def _chunks(flat: torch.Tensor, n: int):
    bounds = chunk_bounds(flat.numel(), n)
    return lambda c: flat[bounds[c % n]:bounds[c % n + 1]]


def _reduce_scatter(flat: torch.Tensor, rank: int, n: int, group: dist.ProcessGroup | None) -> None:
    chunk, right, left = _chunks(flat, n), (rank + 1) % n, (rank - 1) % n
    incoming = torch.empty_like(chunk(0))  # chunk 0 is the largest
    for s in range(n - 1):
        mine = chunk(rank - s - 2)
        received = incoming[:mine.numel()]
        sendrecv(chunk(rank - s - 1), right, received, left, group)
        mine.add_(received)


def _all_gather(flat: torch.Tensor, rank: int, n: int, group: dist.ProcessGroup | None) -> None:
    chunk, right, left = _chunks(flat, n), (rank + 1) % n, (rank - 1) % n
    for s in range(n - 1):
        sendrecv(chunk(rank - s), right, chunk(rank - s - 1), left, group)


def _ring(flat: torch.Tensor, rank: int, n: int, group: dist.ProcessGroup | None) -> None:
    _reduce_scatter(flat, rank, n, group)
    _all_gather(flat, rank, n, group)


def own_chunk(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """This rank's chunk of `tensor`'s flat storage (a view): chunk r of basics.chunk_bounds."""
    bounds = chunk_bounds(tensor.numel(), dist.get_world_size(group))
    rank = group_rank(group)
    return tensor.detach().view(-1)[bounds[rank]:bounds[rank + 1]]


def ring_textbook_allreduce(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Ring reduce-scatter + all-gather, one message per chunk and step."""
    return run_textbook(tensor, group, _ring)


def ring_textbook_reduce_scatter(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Sum `tensor` across the ranks of `group` so that this rank's chunk holds the sum;
    returns that chunk (own_chunk: a view into `tensor`, whose other chunks then hold
    partial sums). Any length: the chunks differ by at most one element."""
    run_textbook(tensor, group, _reduce_scatter)
    return own_chunk(tensor, group)


def ring_textbook_all_gather(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Copy every rank's own chunk of `tensor` (own_chunk) into the same place on every
    other rank, in place; returns `tensor`."""
    return run_textbook(tensor, group, _all_gather)
