"""Sequences of pairwise exchanges, as naive and halving-doubling run them
(and the ring at 2 ranks, where both neighbours are the same peer).

A Step is one exchange with one peer: send, receive, then add what was
received. run_steps() posts them in order, and how it posts them on gloo's
TCP transport (all receives first, or each send before its receive) is what
decides their speed: see run_steps.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

from ddp_lab.collectives.tuned.p2p import Comm, wait_all
from ddp_lab.collectives.tuned.plan import TunedPlan

# With gloo's threads at normal priority and 3+ ranks, exchanges post all
# their receives first for tensors up to this size, and each send before its
# receive above it.
EARLY_RECV_MAX_BYTES = 1024 * 1024


class Step(NamedTuple):
    """One exchange with one peer: send `send`, receive into `recv`, then
    (optionally) add what was received into `add_into`. Either side may be
    None. `tag` names the exchange, identically on both peers."""

    peer: int
    tag: int
    send: torch.Tensor | None
    recv: torch.Tensor | None
    add_into: torch.Tensor | None = None


def receives_first(flat: torch.Tensor, comm: Comm, plan: TunedPlan) -> bool:
    """Whether a pairwise exchange on gloo posts its receives before its sends (all of
    them at once, or each step's just before its send: see run_steps).

    Which order is cheaper depends on how gloo's threads are scheduled:

    * real-time (plan.realtime_threads): always. A hand-off between threads is
      immediate, so a send whose receive is already posted is the cheapest
      message whatever its size.
    * across hosts (plan.across_hosts): always. Posted late, the payload waits
      for the receiver's "ready" and the link carries one direction at a time.
    * normal: with 3+ ranks up to EARLY_RECV_MAX_BYTES. With only two
      processes, each blocked on the other, a send that goes out at once beats
      one whose receive was announced first (see run_steps for what each costs).

    Measurements: docs/communication.md, "Halving-doubling" and "Across a network".
    """
    if plan.realtime_threads or plan.across_hosts:
        return True
    return comm.size > 2 and flat.numel() * flat.element_size() <= EARLY_RECV_MAX_BYTES


def run_steps(comm: Comm, steps: list[Step], receives_first: bool, each_step: bool = False) -> None:
    """Run a sequence of exchanges, each step's send after the previous step's add.

    On gloo's TCP transport a send whose receive is already posted on the
    other side goes out at once, from the sending thread; otherwise it
    announces itself and the payload follows when the receiver replies
    "ready", written by gloo's I/O thread. Which is cheaper depends on size
    and on how gloo's threads are scheduled (see receives_first):

    * receives_first=True: every receive is posted before anything is
      sent, so each step costs one message latency, not three. Each receive
      then needs its own buffer, and data arriving early must never
      overwrite something still to be sent (the callers guarantee it: such
      data can only arrive after the peer got what it needed from us).
      With each_step=True a step's receive is posted just before its send
      instead, so no partner of a later step sends before its turn: across
      hosts, a later step's data arriving early shares the link with the
      step under way (docs/communication.md, "Across a network").
    * receives_first=False (large tensors, threads at normal priority): each
      step posts its send, then its receive. In a pairwise exchange the peer
      usually has not posted its receive yet, so the payload is written by
      gloo's I/O thread, which reads and writes the connection in one
      thread. Had the receive been posted first, our thread would write the
      payload itself while the peer's data arrives on the same connection,
      and gloo's I/O thread spins on the connection's lock until the write
      is done: about 60% more CPU for a 4 MiB exchange, which an
      oversubscribed machine pays in time. With the threads at real-time
      priority, receives first is faster at every size all the same.

    On NCCL each step's send and receive are launched together as one batch.
    """
    if comm.batched:
        for st in steps:
            comm.sendrecv(None if st.recv is None else (st.recv, st.peer),
                          None if st.send is None else (st.send, st.peer), st.tag)
            if st.add_into is not None:
                st.add_into.add_(st.recv)
        return
    recv_works: list[dist.Work | None] = [None] * len(steps)
    if receives_first and not each_step:
        for i in reversed(range(len(steps))):  # the first step's data comes first
            if steps[i].recv is not None:
                recv_works[i] = comm.irecv(steps[i].recv, steps[i].peer, steps[i].tag)
    send_works: list[dist.Work] = []
    for i, st in enumerate(steps):
        if receives_first and each_step and st.recv is not None:
            recv_works[i] = comm.irecv(st.recv, st.peer, st.tag)
        if st.send is not None:
            work = comm.isend(st.send, st.peer, st.tag)
            if work is not None:
                send_works.append(work)
        if st.recv is not None:
            work = recv_works[i] if receives_first else comm.irecv(st.recv, st.peer, st.tag)
            if work is not None:
                work.wait()
        if st.add_into is not None:
            st.add_into.add_(st.recv)
    wait_all(send_works)
