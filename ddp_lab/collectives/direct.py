"""Reduce-scatter and all-gather with every chunk sent straight to the rank that owns it
(MSCCL calls this pattern "all-pairs"), and the all-reduce made of the two.

The data is cut into n chunks (basics.chunk_bounds); rank r owns chunk r.

* Reduce-scatter: rank r sends its chunk j to rank j, for every j != r, and receives
  every other rank's copy of chunk r, which it adds into its own. (n-1)/n*N bytes leave
  each rank, as in the ring, but in one step of n-1 messages at once instead of n-1
  steps one after another: alpha + (n-1)/n*N*beta + (n-1)/n*N*gamma on a switch whose
  links carry every rank's traffic at the same time (the emulated cluster's bridge does).
* All-gather: rank r sends its own chunk to every other rank, and receives theirs
  straight into place. alpha + (n-1)/n*N*beta.

Two things the ring cannot do follow from that one step:

1. Every message can be posted at once, so a call can return before the data has
   travelled (``async_op=True``: a Pending whose wait() finishes the call). ZeRO posts a
   gradient bucket's reduce-scatter from a backward hook and goes on computing, and the
   weights' all-gather from after the optimizer step, waited for by the forward that
   needs them (sync/sharded/zero2.py).
2. The receives are posted before the sends. On gloo's TCP transport a send whose
   receive is already posted goes out at once; a send posted first waits for the
   receiver's "ready", and across hosts the link then carries one direction at a time
   (docs/communication.md, "Across a network"): the textbook ring's sendrecv, which
   posts its send first, ran at half the link at 2 hosts.

The price: a receive buffer of (n-1)/n*N (the ring needs one chunk), and n-1 peers
writing to a rank at once, which only a switch with full-bisection links carries at full
rate. Same signature and rules as the other all-reduces (ddp_lab.collectives).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.collectives.basics import Pending, check_tensor, chunk_bounds, group_rank, stages_through_host


def _post(recvs: list[tuple[torch.Tensor, int]], sends: list[tuple[torch.Tensor, int]],
          group: dist.ProcessGroup | None) -> list:
    """Post every receive, then every send (group ranks); an empty tensor is not posted
    (both sides know its size). One batch: NCCL would otherwise deadlock blocking sends."""
    ops = [dist.P2POp(dist.irecv, t, group=group, group_peer=p) for t, p in recvs if t.numel()]
    ops += [dist.P2POp(dist.isend, t, group=group, group_peer=p) for t, p in sends if t.numel()]
    return dist.batch_isend_irecv(ops) if ops else []


def _start(tensor: torch.Tensor, group: dist.ProcessGroup | None):
    """(rank, n, the flat tensor, where the messages travel from (it, or a host copy), chunk c's slice)."""
    check_tensor(tensor)
    rank, n = group_rank(group), dist.get_world_size(group)
    flat = tensor.detach().view(-1)  # gradients require grad; summing them is not part of a graph
    wire = flat.cpu() if stages_through_host(tensor, group) else flat  # gloo's p2p is CPU only
    bounds = chunk_bounds(flat.numel(), n)
    return rank, n, flat, wire, lambda c: slice(bounds[c], bounds[c + 1])


def direct_reduce_scatter(tensor: torch.Tensor, group: dist.ProcessGroup | None = None,
                          async_op: bool = False):
    """Sum `tensor` across the ranks of `group` so that this rank's chunk holds the sum, and
    return that chunk (own_chunk: a view into `tensor`; the other chunks keep this rank's own
    numbers). async_op: return a Pending instead; `tensor` must not change until its wait()."""
    rank, n, flat, wire, chunk = _start(tensor, group)
    peers = [(rank + s) % n for s in range(1, n)]  # each rank starts with its right neighbour
    mine = chunk(rank)
    incoming = {p: torch.empty_like(wire[mine]) for p in peers}
    works = _post([(incoming[p], p) for p in peers], [(wire[chunk(p)], p) for p in peers], group)

    def finish() -> torch.Tensor:
        for p in sorted(incoming):  # into this rank's own numbers, then the others in rank order
            wire[mine].add_(incoming[p])
        if wire is not flat:
            flat[mine].copy_(wire[mine])
        return flat[mine]

    pending = Pending(works, finish)
    return pending if async_op else pending.wait()


def direct_all_gather(tensor: torch.Tensor, group: dist.ProcessGroup | None = None,
                      async_op: bool = False):
    """Copy every rank's own chunk of `tensor` into the same place on every other rank, in
    place, and return `tensor`. async_op: return a Pending instead; until its wait(), this
    rank's chunk must not change and the others are not there yet."""
    rank, n, flat, wire, chunk = _start(tensor, group)
    peers = [(rank + s) % n for s in range(1, n)]
    works = _post([(wire[chunk(p)], p) for p in peers], [(wire[chunk(rank)], p) for p in peers], group)

    def finish() -> torch.Tensor:
        if wire is not flat:
            flat.copy_(wire)
        return tensor

    pending = Pending(works, finish)
    return pending if async_op else pending.wait()


def direct_allreduce(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Reduce-scatter, then all-gather, each in one step of n-1 messages at once."""
    check_tensor(tensor)
    group_rank(group)  # ValueError outside the group
    if dist.get_world_size(group) > 1:
        direct_reduce_scatter(tensor, group)
        direct_all_gather(tensor, group)
    return tensor
