"""The ring all-reduce, pipelined in segments.

The data is cut into n chunks; a reduce-scatter passes chunks around the
ring (each rank adds what it receives and forwards it) until every rank owns
one fully summed chunk, then an all-gather passes the summed chunks around
once more. 2(n-1)*alpha + 2(n-1)/n*N*beta + (n-1)/n*N*gamma: the bandwidth
term does not grow with n (bandwidth-optimal), but the latency term does, so
it is the algorithm for large messages.

Chunks are further cut into segments so that receiving one segment, adding
another and forwarding a third overlap; how small, and how many are in
flight, depends on what a message costs, which on gloo depends on how its
threads are scheduled (ring_plan, from the TunedPlan the caller hands in).
What a call on a buffer sends and receives is worked out once and kept
(p2p.prepared): training reduces the same buffers every step.
ring_textbook.py is the same algorithm without any of this.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

from ddp_lab.collectives.basics import chunk_bounds
from ddp_lab.collectives.tuned.p2p import (
    Comm,
    prepared,
    run_on_comm_device,
    scratch,
    wait_all,
)
from ddp_lab.collectives.tuned.plan import DEFAULT_PLAN, TunedPlan

_TAG = 1000  # + unit index: each ring message has its own tag

# Segment size on the host (gloo/TCP), by how gloo's threads are scheduled
# (TunedPlan.realtime_threads), because that sets what a message costs. Smaller
# segments overlap transfer, addition and forwarding better and stay in cache
# between arriving and being added, but every message has a fixed cost:
# thread wake-ups and lock hand-offs on both sides, and Python.
# * normal: a woken thread may wait for a scheduler tick on a busy machine,
#   so one message per chunk up to 4 MiB; smaller segments were no faster.
# * realtime: hand-offs are immediate, so smaller segments pay off, two
#   units in flight (WINDOW_REALTIME), as gloo's own ring does; no other
#   size or window tried beat 768 KiB and 2. Unlike gloo's ring, small chunks
#   are not cut in two: below a segment's size, a message saved beats overlap.
# Measurements: docs/communication.md, "How gloo's threads are scheduled".
# Chunks above the size are cut into near-equal segments of at most this
# size (TunedPlan.segment_bytes overrides it).
SEGMENT_BYTES = {"normal": 4 * 1024 * 1024, "realtime": 768 * 1024}
WINDOW_REALTIME = 2
# Across hosts (real-time threads), every chunk of at least twice this size is
# cut in two or more segments, as gloo's own ring cuts them: while one segment
# is added and forwarded the next is on the wire, and a link's time, not a
# message's, is what counts there; segments below this size were slower
# (docs/communication.md, "Across a network").
MIN_SPLIT_SEGMENT_BYTES = 256 * 1024


class RingPlan(NamedTuple):
    """How the ring cuts and paces its messages (see ring_plan)."""

    segments: int  # per chunk (k); one unit = one segment sent and one received
    window: int  # units in flight: unit u is posted once unit u-window is finished (<= k)
    send_first: bool  # within a unit, post the send before the receive
    receives_ahead: bool  # post (almost) every receive before the first send (implies send_first)


def ring_plan(comm: Comm, plan: TunedPlan, chunk_numel: int, element_size: int) -> RingPlan:
    """Segments and pacing for this call, from where the data is and how the
    threads that move it are scheduled (measured on 2 cores, 2-4 processes;
    see SEGMENT_BYTES).

    * NCCL: one message per chunk, each launched with its receive; NCCL
      pipelines internally, and each extra message is a kernel launch.
      Receives are not posted ahead: every rank's stream would then wait on
      a receive whose matching send is queued behind it on the sender's.
    * gloo, real-time threads: segments of at most 768 KiB, two units in
      flight, each unit's receive posted before its send, as gloo's own ring
      does: with no scheduling delays, small messages are cheap. Across
      hosts at least two segments per chunk of 512 KiB or more.
    * gloo, normal threads: segments of at most 4 MiB. With 3+ ranks every
      receive is posted before the first send: on gloo's TCP transport a
      send whose receive is already posted on the other side goes out at
      once from the sending thread; otherwise it announces itself and waits
      for a "ready" reply, several thread wake-ups. With 2 ranks both
      neighbours are the same peer, a pairwise exchange: send before
      receive, k units in flight (see pairwise.receives_first), unless the
      two ranks are on different hosts: receives ahead then, or the link
      carries one direction at a time (docs/communication.md, "Across a
      network").
    """
    if comm.batched:
        return RingPlan(segments=1, window=1, send_first=False, receives_ahead=False)
    seg_bytes = plan.segment_bytes or SEGMENT_BYTES["realtime" if plan.realtime_threads else "normal"]
    chunk_bytes = chunk_numel * element_size
    k = max(1, -(-chunk_bytes // seg_bytes))
    if plan.realtime_threads:
        if plan.across_hosts and chunk_bytes >= 2 * MIN_SPLIT_SEGMENT_BYTES:
            k = max(k, 2)
        return RingPlan(k, min(k, WINDOW_REALTIME), send_first=False, receives_ahead=False)
    if comm.size == 2 and not plan.across_hosts:
        return RingPlan(k, k, send_first=True, receives_ahead=False)
    return RingPlan(k, k, send_first=True, receives_ahead=True)


class _RingCall(NamedTuple):
    """One rank's messages for a ring all-reduce of one buffer (see _prepare_ring)."""

    plan: RingPlan
    left: int  # group rank we receive from
    right: int  # group rank we send to
    # Per unit u (see _prepare_ring): the segment sent, the tensor received
    # into (None where the segment is empty: nothing is posted, on either
    # side), and for the reduce-scatter the (destination, received) pair to
    # add.
    sends: list[torch.Tensor | None]
    recvs: list[torch.Tensor | None]
    adds: list[tuple[torch.Tensor, torch.Tensor] | None]
    rs_units: int  # units of the reduce-scatter; the all-gather's follow
    slots: int  # scratch slots the reduce-scatter's receives cycle through


def _prepare_ring(flat: torch.Tensor, comm: Comm, tuned: TunedPlan) -> _RingCall:
    n, rank = comm.size, comm.rank
    chunks = chunk_bounds(flat.numel(), n)
    plan = ring_plan(comm, tuned, chunks[1] - chunks[0], flat.element_size())
    k, window = plan.segments, plan.window
    # seg[c][j] = (start, stop) of segment j of chunk c. Every chunk gets the
    # same number of segments (some possibly empty), so both neighbours agree
    # on the size of every message.
    seg = []
    for c in range(n):
        b = chunk_bounds(chunks[c + 1] - chunks[c], k)
        seg.append([(chunks[c] + b[j], chunks[c] + b[j + 1]) for j in range(k)])
    seg_numel = max(stop - start for c in seg for start, stop in c)

    # The whole all-reduce is one stream of 2(n-1)*k units; unit u = (step s,
    # segment j) sends one segment to the right and receives one from the
    # left:
    #   reduce-scatter (s < n-1): send chunk rank-s, receive chunk rank-s-1
    #       into scratch and add it into our copy;
    #   all-gather (t = s-(n-1) >= 0): send chunk rank+1-t, receive chunk
    #       rank-t straight into place.
    # Apart from step 0 (our own data), what unit u sends is what unit u-k
    # received: the chunk finished in one step is forwarded in the next. So
    # unit u is posted once unit u-window (window <= k) is finished, which
    # keeps `window` units in flight while we add.
    units = 2 * (n - 1) * k
    rs_units = (n - 1) * k
    if plan.receives_ahead:
        # Each receive posted ahead needs its own scratch slot, unless that
        # takes more than tuned.max_scratch_bytes; then slots are reused, and
        # the receive for a slot is posted once the previous unit in it has
        # been added.
        cap = max(1, tuned.max_scratch_bytes // max(1, seg_numel * flat.element_size()))
        slots = min(rs_units, max(2 * k, cap))
    else:
        # Unit u's slot was last used by unit u-window, finished before u is
        # posted. (NCCL: stream order makes that safe as well.)
        slots = window
    space = scratch(slots * seg_numel, flat)

    sends, recvs, adds = [], [], []
    for u in range(units):
        s, j = divmod(u, k)
        if s < n - 1:
            (sa, sb), (ra, rb) = seg[(rank - s) % n][j], seg[(rank - s - 1) % n][j]
            slot = (u % slots) * seg_numel
            incoming = space[slot: slot + rb - ra]
            adds.append((flat[ra:rb], incoming) if rb > ra else None)
        else:
            t = s - (n - 1)
            (sa, sb), (ra, rb) = seg[(rank + 1 - t) % n][j], seg[(rank - t) % n][j]
            adds.append(None)
            incoming = flat[ra:rb]
        recvs.append(incoming if rb > ra else None)
        sends.append(flat[sa:sb] if sb > sa else None)
    return _RingCall(plan, left=(rank - 1) % n, right=(rank + 1) % n, sends=sends,
                     recvs=recvs, adds=adds, rs_units=rs_units, slots=slots)


def _ring(flat: torch.Tensor, comm: Comm, tuned: TunedPlan) -> None:
    call = prepared(flat, comm, tuned, _prepare_ring)
    plan, left, right = call.plan, call.left, call.right
    k, window, slots, rs_units = plan.segments, plan.window, call.slots, call.rs_units
    sends, recvs, adds = call.sends, call.recvs, call.adds
    units = len(sends)
    gloo = comm.gloo
    recv_works: list[dist.Work | None] = [None] * units
    send_works: list[dist.Work] = []
    # Every unit has its own tag: messages can only match the receive they
    # were meant for, whatever order the receives are posted in.
    if plan.receives_ahead:
        # Unit 0's data comes first, so its receive is posted last: posting
        # receives while data arrives contends with gloo's I/O thread, which
        # holds a connection's lock while it reads. Early receives into the
        # all-gather destination are safe: nothing lands there before our
        # own sends of that data completed, since the data that replaces it
        # has gone around the ring.
        for u in [*range(1, slots), *range(rs_units, units), 0]:
            if recvs[u] is not None:
                recv_works[u] = gloo.recv([recvs[u]], left, _TAG + u)

    # Unit u is posted once unit u - window is finished. This loop is the
    # path from one hop to the next (receive, add, forward), so it is kept
    # flat: on an oversubscribed machine every extra call here slows the
    # whole ring down.
    for u in range(units + window):
        if u >= window:  # finish unit u - window: wait for it, add it in
            done = u - window
            if recv_works[done] is not None:
                recv_works[done].wait()
            if adds[done] is not None:
                adds[done][0].add_(adds[done][1])
        if u >= units:
            continue
        recv, send, tag = recvs[u], sends[u], _TAG + u
        if comm.batched:
            recv_list, send_list = comm.exchange(None if recv is None else (recv, left),
                                                 None if send is None else (send, right), tag)
            recv_works[u] = recv_list[0] if recv_list else None
            send_works.extend(send_list)
            continue
        if send is not None and plan.send_first:
            send_works.append(gloo.send([send], right, tag))
        if plan.receives_ahead:
            # The scratch slot of unit u-k is free again: receive into it.
            ahead = u - k + slots
            if u >= k and ahead < rs_units and recvs[ahead] is not None:
                recv_works[ahead] = gloo.recv([recvs[ahead]], left, _TAG + ahead)
        elif recv is not None:
            recv_works[u] = gloo.recv([recv], left, tag)
        if send is not None and not plan.send_first:
            send_works.append(gloo.send([send], right, tag))
    wait_all(send_works)


def ring_allreduce(tensor: torch.Tensor, group: dist.ProcessGroup | None = None,
                   plan: TunedPlan = DEFAULT_PLAN) -> torch.Tensor:
    """Ring reduce-scatter + all-gather, pipelined in segments as `plan` says."""
    return run_on_comm_device(tensor, group, plan, _ring)
