"""All-reduce (SUM, in place) written with point-to-point messages.

Each function has the signature ``fn(tensor, group=None) -> tensor``: it sums
``tensor`` across the ranks of ``group`` (the default group when None),
overwrites it with the result on every rank and returns the same object, so
they can stand in for ``dist.all_reduce(tensor, group=group)``.

Cost model for n ranks and an N-byte message: alpha is the per-message
latency, beta the time per byte on a link, gamma the time per byte to add.

* ``naive_allreduce`` (naive.py): everyone sends to group rank 0, which adds
  and sends the sum back. 2(n-1)*(alpha + N*beta) + (n-1)*N*gamma at the root.
* ``ring_allreduce`` (ring.py): reduce-scatter then all-gather around a ring,
  pipelined in segments. 2(n-1)*alpha + 2(n-1)/n*N*beta + (n-1)/n*N*gamma:
  bandwidth-optimal, for large messages.
* ``halving_doubling_allreduce`` (halving_doubling.py): Rabenseifner's
  recursive halving then doubling, with a fold-in step when n is not a power
  of two. 2*log2(n)*alpha plus the ring's bandwidth term: for small and
  medium messages.
* ``builtin_allreduce``: ``dist.all_reduce``, the reference the others are
  checked and timed against.

What they share lives in p2p.py (a rank's view of its group, input checks,
host staging, what a thread keeps between calls) and pairwise.py (sequences
of two-rank exchanges, for naive and halving-doubling).

Shared rules:

* Supported dtypes: float32, float64, bfloat16, float16. bfloat16/float16 are
  accumulated in their own dtype (every addition rounds to it; no wider
  accumulator), as gloo's own all-reduce does. Results can therefore differ
  from ``dist.all_reduce`` in the last bits, because the summation order
  differs; for n ranks the error stays within n * unit-roundoff * sum|x_i|.
  Integer and bool tensors raise TypeError rather than risk silent overflow
  or a meaningless "sum" of bools.
* The tensor must be contiguous (the algorithms send views of its flat
  storage); otherwise ValueError. The hand-written ones raise ValueError in
  a process outside ``group``.
* Ranks are group ranks (``dist.get_rank(group)``), so subgroups work.
* Every rank computes the same chunk boundaries, so the two sides of a
  message always agree on its size; empty pieces are skipped on both sides
  (never a zero-length message that the peer does not expect).
* Tags keep messages apart: one tag per phase (naive), per phase and level
  (halving-doubling) or per message (ring), and between a pair of ranks
  messages are posted in the same order on both sides, so no receive can
  match a message meant for another phase or step (gloo matches by peer and
  tag, in posting order; NCCL ignores tags and relies on the order alone).
* On gloo, a CUDA tensor is copied to the host, reduced there (gloo's
  point-to-point is CPU only) and copied back. On NCCL, CUDA tensors are
  used directly and every exchange is posted with ``dist.batch_isend_irecv``
  so that a rank's send and receive of a step are launched together (NCCL
  would otherwise deadlock a ring of blocking sends).
* Host scratch buffers and the ring's prepared messages are kept between
  calls, per thread; ``free_scratch_buffers()`` releases them.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from ddp_lab.collectives.halving_doubling import halving_doubling_allreduce
from ddp_lab.collectives.naive import naive_allreduce
from ddp_lab.collectives.p2p import SUPPORTED_DTYPES, check_tensor, free_scratch_buffers
from ddp_lab.collectives.ring import ring_allreduce

__all__ = [
    "ALGORITHMS",
    "SUPPORTED_DTYPES",
    "builtin_allreduce",
    "free_scratch_buffers",
    "get_algorithm",
    "halving_doubling_allreduce",
    "naive_allreduce",
    "ring_allreduce",
]


def builtin_allreduce(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """dist.all_reduce(SUM): the backend's own algorithm, used as the reference."""
    check_tensor(tensor)
    if dist.get_world_size(group) > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    return tensor


ALGORITHMS: dict[str, Callable[..., torch.Tensor]] = {
    "builtin": builtin_allreduce,
    "naive": naive_allreduce,
    "ring": ring_allreduce,
    "halving_doubling": halving_doubling_allreduce,
}


def get_algorithm(name: str) -> Callable[..., torch.Tensor]:
    """Look an all-reduce up by name; ValueError lists the valid names."""
    try:
        return ALGORITHMS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown all-reduce algorithm {name!r}; choose one of: "
            + ", ".join(ALGORITHMS)
        ) from None
