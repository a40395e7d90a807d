"""Rabenseifner's all-reduce as the textbook writes it (Thakur, Rabenseifner
& Gropp 2005), for any number of ranks.

For p ranks, p a power of two, and the data cut into p chunks:

* Reduce-scatter by recursive halving: every rank starts with all p chunks
  as its window. In each of log2(p) steps it pairs with the rank at distance
  p/2, then p/4, ..., 1, keeps the half of its window that holds its own
  chunk, sends the other half to the partner (who keeps that one) and adds
  the partner's copy of the half it kept. Rank r ends with chunk r summed.
* All-gather by recursive doubling: the same pairs in reverse order swap
  windows, which double each step, until every rank has every chunk.

2*log2(p)*alpha + 2(p-1)/p*N*beta + (p-1)/p*N*gamma: the ring's bandwidth
term with log2(p) latencies instead of p-1, for small and medium messages.

n ranks, not a power of two: with p the largest power of two below n, the
first 2(n-p) ranks pair up first (fold-in). The even rank of each pair sends
its data to the odd one and waits; the odd one adds it and stands for both
among the p ranks left, renumbered 0..p-1, and sends the result back at the
end: two more full-size messages and one more addition.
halving_doubling.py is the same algorithm tuned for speed.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.collectives.basics import chunk_bounds, run_textbook, sendrecv


def _halving_doubling(flat: torch.Tensor, rank: int, n: int, group: dist.ProcessGroup | None) -> None:
    p = 1 << (n.bit_length() - 1)  # largest power of two <= n
    folded = 2 * (n - p)  # ranks 0..folded-1 pair up
    if rank < folded and rank % 2 == 0:  # fold-in: hand over the data, wait for the sum
        dist.send(flat, group=group, group_dst=rank + 1)
        dist.recv(flat, group=group, group_src=rank + 1)
        return
    if rank < folded:
        partners_data = torch.empty_like(flat)
        dist.recv(partners_data, group=group, group_src=rank - 1)
        flat.add_(partners_data)
    me = rank // 2 if rank < folded else rank - folded // 2  # my rank among the p

    def real(q: int) -> int:  # the group rank standing as rank q of the p
        return 2 * q + 1 if q < folded // 2 else q + folded // 2

    bounds = chunk_bounds(flat.numel(), p)

    def window(lo: int, hi: int) -> torch.Tensor:  # chunks lo..hi-1
        return flat[bounds[lo]:bounds[hi]]

    lo, hi, distance = 0, p, p // 2
    while distance >= 1:  # reduce-scatter by recursive halving
        mid = (lo + hi) // 2
        (keep_lo, keep_hi), give = ((mid, hi), (lo, mid)) if me & distance else ((lo, mid), (mid, hi))
        kept = window(keep_lo, keep_hi)
        partners_half = torch.empty_like(kept)
        sendrecv(window(*give), real(me ^ distance), partners_half, real(me ^ distance), group)
        kept.add_(partners_half)
        lo, hi, distance = keep_lo, keep_hi, distance // 2
    distance = 1
    while distance < p:  # all-gather by recursive doubling
        width = hi - lo
        other = (lo - width, lo) if me & distance else (hi, hi + width)
        sendrecv(window(lo, hi), real(me ^ distance), window(*other), real(me ^ distance), group)
        lo, hi, distance = min(lo, other[0]), max(hi, other[1]), distance * 2
    if rank < folded:  # fold-out: the sum to the partner that sat out
        dist.send(flat, group=group, group_dst=rank - 1)


def halving_doubling_textbook_allreduce(
    tensor: torch.Tensor, group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """Recursive-halving reduce-scatter + recursive-doubling all-gather."""
    return run_textbook(tensor, group, _halving_doubling)
