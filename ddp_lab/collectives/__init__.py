"""All-reduce (SUM, in place) written with point-to-point messages.

Start with the textbook versions, written to be read: each is a short
function on dist.isend/dist.irecv with nothing kept between calls.

* ``ring_textbook_allreduce`` (ring_textbook.py): reduce-scatter then
  all-gather around a ring. 2(n-1)*alpha + 2(n-1)/n*N*beta +
  (n-1)/n*N*gamma: bandwidth-optimal, for large messages. Its two phases
  are callable on their own: ``ring_textbook_reduce_scatter`` (each rank ends
  with the sum of its own chunk, ``own_chunk``) and
  ``ring_textbook_all_gather`` (each rank's chunk copied to every other),
  what sharded data parallelism is built from.
* ``direct_allreduce`` (direct.py): every chunk sent straight to the rank
  that owns it, all messages of a phase at once (all-pairs):
  2*alpha + the ring's bandwidth term on a switch. Its two phases,
  ``direct_reduce_scatter`` and ``direct_all_gather``, can return before
  the data has travelled (``async_op=True``), which is how sync=zero
  overlaps them with computation.
* ``halving_doubling_textbook_allreduce`` (halving_doubling_textbook.py):
  Rabenseifner's recursive halving then doubling, with a fold-in step when
  n is not a power of two. 2*log2(n)*alpha plus the ring's bandwidth term:
  for small and medium messages.

(n ranks, an N-byte message: alpha is the per-message latency, beta the
time per byte on a link, gamma the time per byte to add.)

Then the same algorithms tuned for speed on gloo, each trick kept with the
reason for it (the measurements are in docs/communication.md):
``ring_allreduce`` (tuned/ring.py: segments pipelined, the messages of a call
worked out once per buffer and kept) and
``halving_doubling_allreduce`` (tuned/halving_doubling.py), plus
``naive_allreduce`` (naive.py: everyone sends to group rank 0, which adds
and sends the sum back; 2(n-1)*(alpha + N*beta) + (n-1)*N*gamma at the
root). Their shared machinery is in tuned/p2p.py (a rank's view of its group, host
staging, what a thread keeps between calls) and tuned/pairwise.py (sequences of
two-rank exchanges). How they cut and order their messages depends on the
machine, which they are told by argument: a TunedPlan (tuned/plan.py), decided at
start-up by ddp_lab.tuning; without one they plan for gloo's threads at
normal priority. ``builtin_allreduce`` is ``dist.all_reduce``, the
reference all of them are checked and timed against.

Every one has the signature ``fn(tensor, group=None) -> tensor`` (the tuned
ones take ``plan=`` as well): it sums ``tensor`` across the ranks of
``group`` (the default group when None), overwrites it with the result on
every rank and returns the same object, so they can stand in for
``dist.all_reduce(tensor, group=group)``. ``get_algorithm(name, plan)``
looks one up by name, with the plan bound.

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
* Every rank computes the same chunk boundaries (basics.chunk_bounds), so
  the two sides of a message always agree on its size. The tuned versions
  skip empty pieces on both sides; the textbook ones send them.
* Messages between a pair of ranks are posted in the same order on both
  sides, so no receive can match a message meant for another step (gloo
  matches by peer and tag, in posting order; NCCL by order alone). The
  tuned versions also give each phase, level or message its own tag.
* On gloo, a CUDA tensor is copied to the host, reduced there (gloo's
  point-to-point is CPU only) and copied back. On NCCL, CUDA tensors are
  used directly and a rank's send and receive of a step are launched
  together (``dist.batch_isend_irecv``: NCCL would otherwise deadlock a ring
  of blocking sends).
* The tuned versions keep host scratch buffers and the ring's prepared
  messages between calls, per thread; ``free_scratch_buffers()`` releases
  them.
* With gloo's threads at real-time priority (dist.comm_threads), call them
  inside ``ddp_lab.tuning.gloo_threads.at_comm_priority``: they post gloo's messages from
  the calling thread (ddp_lab.tuning.allreduce does this for you).
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.distributed as dist

from ddp_lab.collectives.basics import SUPPORTED_DTYPES, TORCH_ALL_GATHER, TORCH_REDUCE_SCATTER, check_tensor
from ddp_lab.collectives.direct import direct_all_gather, direct_allreduce, direct_reduce_scatter
from ddp_lab.collectives.halving_doubling_textbook import (
    halving_doubling_textbook_allreduce,
)
from ddp_lab.collectives.naive import naive_allreduce
from ddp_lab.collectives.ring_textbook import (
    own_chunk,
    ring_textbook_all_gather,
    ring_textbook_allreduce,
    ring_textbook_reduce_scatter,
)
from ddp_lab.collectives.tuned.halving_doubling import halving_doubling_allreduce
from ddp_lab.collectives.tuned.p2p import free_scratch_buffers
from ddp_lab.collectives.tuned.plan import TunedPlan
from ddp_lab.collectives.tuned.ring import ring_allreduce

__all__ = [
    "ALGORITHMS",
    "SUPPORTED_DTYPES",
    "TORCH_ALL_GATHER",
    "TORCH_REDUCE_SCATTER",
    "TUNED",
    "TunedPlan",
    "builtin_allreduce",
    "direct_all_gather",
    "direct_allreduce",
    "direct_reduce_scatter",
    "free_scratch_buffers",
    "get_algorithm",
    "halving_doubling_allreduce",
    "halving_doubling_textbook_allreduce",
    "naive_allreduce",
    "own_chunk",
    "ring_allreduce",
    "ring_textbook_all_gather",
    "ring_textbook_allreduce",
    "ring_textbook_reduce_scatter",
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
    "ring_textbook": ring_textbook_allreduce,
    "halving_doubling_textbook": halving_doubling_textbook_allreduce,
    "direct": direct_allreduce,
}
# The ones that take a TunedPlan (plan=...).
TUNED = ("naive", "ring", "halving_doubling")


def get_algorithm(name: str, plan: TunedPlan | None = None) -> Callable[..., torch.Tensor]:
    """Look an all-reduce up by name, as `fn(tensor, group=None)`, with `plan`
    bound where it takes one; ValueError lists the valid names."""
    try:
        fn = ALGORITHMS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown all-reduce algorithm {name!r}; choose one of: "
            + ", ".join(ALGORITHMS)
        ) from None
    if plan is not None and name in TUNED:
        return functools.partial(fn, plan=plan)
    return fn
