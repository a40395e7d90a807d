"""Rabenseifner's all-reduce: a reduce-scatter by recursive vector halving
(exchange half the current window with the partner at distance p/2, p/4,
..., 1) then an all-gather by recursive doubling.

2*log2(n)*alpha + 2(n-1)/n*N*beta + (n-1)/n*N*gamma: the same bandwidth term
as the ring with 2*log2(n) instead of 2(n-1) latencies, so it suits small
and medium messages. When n is not a power of two, the first 2*(n-p) ranks
(p the largest power of two <= n) fold in pairwise first and the idle rank
of each pair gets the result at the end, which costs two more full-message
steps (alpha + N*beta each) and one more addition.
halving_doubling_textbook.py is the same algorithm without the tuning.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.collectives.basics import chunk_bounds
from ddp_lab.collectives.tuned.p2p import Comm, prepared, run_on_comm_device, scratch
from ddp_lab.collectives.tuned.pairwise import Step, receives_first, run_steps
from ddp_lab.collectives.tuned.plan import DEFAULT_PLAN, TunedPlan

_TAG_FOLD_IN = 201
_TAG_FOLD_OUT = 202
_TAG_RS = 300  # + level (< 64)
_TAG_AG = 400  # + level


def _halving_doubling(flat: torch.Tensor, comm: Comm, plan: TunedPlan) -> None:
    # The steps for a buffer are worked out once and kept (p2p.prepared), as
    # the ring's messages are: building them again on every call (the views,
    # the scratch lookup) made small calls slower than gloo's all-reduce
    # instead of faster (docs/communication.md, "Halving-doubling").
    steps, early = prepared(flat, comm, plan, _prepare_halving_doubling)
    run_steps(comm, steps, early, each_step=plan.across_hosts)  # see run_steps


def _prepare_halving_doubling(flat: torch.Tensor, comm: Comm, plan: TunedPlan) -> tuple[list[Step], bool]:
    """This rank's exchanges for one buffer, and whether their receives are
    posted first (pairwise.receives_first)."""
    n, rank = comm.size, comm.rank
    p = 1 << (n.bit_length() - 1)  # largest power of two <= n
    rem = n - p
    steps: list[Step] = []

    # Fold-in: among the first 2*rem ranks, each even rank hands its data to
    # the odd rank above it and sits out until the result comes back; the p
    # ranks left are renumbered 0..p-1 and run the power-of-two algorithm.
    early = receives_first(flat, comm, plan)
    if rank < 2 * rem and rank % 2 == 0:
        steps.append(Step(rank + 1, _TAG_FOLD_IN, send=flat, recv=None))
        steps.append(Step(rank + 1, _TAG_FOLD_OUT, send=None, recv=flat))
        return steps, early
    # Chunk c of p covers bounds[c]:bounds[c+1]; after the reduce-scatter
    # new rank r owns the sum of chunk r.
    bounds = chunk_bounds(flat.numel(), p)
    new_rank = rank // 2 if rank < 2 * rem else rank - rem

    def group_rank(nr: int) -> int:
        return nr * 2 + 1 if nr < rem else nr + rem

    # Reduce-scatter by recursive halving. [lo, hi) is the window of chunks
    # this rank still reduces; each step keeps the half that holds chunk
    # `new_rank`, sends the other half to the partner (who keeps that one)
    # and adds the partner's copy of the kept half.
    halving = []  # (partner, (keep start, stop), (give start, stop)) in elements
    lo, hi = 0, p
    for level in range(p.bit_length() - 1):  # log2(p) levels
        mask = p >> (level + 1)
        mid = (lo + hi) // 2
        keep, give = ((mid, hi), (lo, mid)) if new_rank & mask else ((lo, mid), (mid, hi))
        halving.append((group_rank(new_rank ^ mask), (bounds[keep[0]], bounds[keep[1]]),
                        (bounds[give[0]], bounds[give[1]])))
        lo, hi = keep

    # Receives posted first each need their own scratch (the pieces halve:
    # about the size of the tensor in all). Otherwise the steps run one
    # after the other and one buffer, as large as the largest piece, serves
    # them all.
    sizes = [kb - ka for _, (ka, kb), _ in halving]
    fold = rank < 2 * rem
    if early:
        space = scratch(sum(sizes) + (flat.numel() if fold else 0), flat)
    else:
        space = scratch(max(sizes + [flat.numel() if fold else 0]), flat)
    offset = 0
    if fold:
        steps.append(Step(rank - 1, _TAG_FOLD_IN, send=None,
                          recv=space[: flat.numel()], add_into=flat))
        offset = flat.numel() if early else 0
    for level, ((partner, (ka, kb), (ga, gb)), size) in enumerate(zip(halving, sizes)):
        steps.append(Step(partner, _TAG_RS + level, send=flat[ga:gb],
                          recv=space[offset: offset + size], add_into=flat[ka:kb]))
        if early:
            offset += size

    # All-gather by recursive doubling: swap windows with the partner at
    # distance 1, 2, ..., p/2, receiving the partner's window in place; ours
    # doubles each step.
    for level in range(p.bit_length() - 1):
        mask = 1 << level
        width = hi - lo
        other = (lo - width, lo) if new_rank & mask else (hi, hi + width)
        steps.append(Step(group_rank(new_rank ^ mask), _TAG_AG + level,
                          send=flat[bounds[lo]:bounds[hi]],
                          recv=flat[bounds[other[0]]:bounds[other[1]]]))
        lo, hi = min(lo, other[0]), max(hi, other[1])

    # Fold-out: hand the result to the rank that sat out.
    if rank < 2 * rem:
        steps.append(Step(rank - 1, _TAG_FOLD_OUT, send=flat, recv=None))
    return steps, early


def halving_doubling_allreduce(
    tensor: torch.Tensor, group: dist.ProcessGroup | None = None, plan: TunedPlan = DEFAULT_PLAN
) -> torch.Tensor:
    """Rabenseifner: recursive-halving reduce-scatter + recursive-doubling all-gather."""
    return run_on_comm_device(tensor, group, plan, _halving_doubling)
