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

from ddp_lab.collectives.p2p import Comm, wait_all
from ddp_lab.collectives.plan import TunedPlan

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

    It depends on how gloo's threads are scheduled (plan.realtime_threads),
    as the ring's plan does, measured on 2-core VMs in interleaved rounds
    against dist.all_reduce:

    * real-time: always. A hand-off between threads is immediate, so a send
      whose receive is already posted is the cheapest message whatever its
      size. On a Zen 5 (2026-11-25) this alone took halving-doubling at 2
      ranks from 0.60-0.66x of gloo's all-reduce to 0.77-0.89x at 4-64 KiB
      (1.00-1.08x with its steps kept as well, see halving_doubling.py), and
      from 0.81-0.88x to 0.92-1.16x at 1-4 MiB (two launches, shuffled
      rounds). On a Zen 1, send-first came out at 0.76-0.88x at 4-64 KiB
      against 0.85-0.93x (a second copy 0.86-0.92x), within the copies'
      spread at 1 MiB (two launches of 15 rounds).
    * across hosts (plan.across_hosts): always. Between two emulated hosts
      on 1 Gbit/s links (ddp_lab.cluster, Zen 1, 2026-11-25), a 2 MiB
      exchange each way ran at 112-120 MB/s each way with the receives
      posted first, 68-69 MB/s send-first: posted late, the payload waits
      for the receiver's "ready" and one direction at a time is carried.
    * normal: with 3+ ranks up to EARLY_RECV_MAX_BYTES. On an AMD EPYC
      (2026-11-22), with 4 ranks, receives first made halving-doubling
      1.1-1.3x faster up to 1 MiB; with 2 ranks it made every size slower,
      up to 3x at 16 KiB (0.6x of gloo's own all-reduce instead of 1.0x):
      with only two processes, each blocked on the other, a send that goes
      out at once beats one whose receive was announced first (see
      run_steps for what each costs). On a Zen 1, at 4-64 KiB: 2 ranks,
      receives first 0.43-0.46x of gloo against send-first 0.83-1.06x (a
      second copy 0.74-1.00x); 3 ranks, send-first 0.80-1.94x against
      receives first 1.38-2.84x (a copy 1.32-3.12x); at 4 MiB within the
      copies' spread (one launch of 11 rounds each).
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
      hosts, a later step's data arriving early shared the link with the
      step under way. Halving-doubling on 8 emulated hosts at 1 Gbit/s
      (Zen 1, 2026-11-25, three calls of each, alternated): 99-106 MB/s
      busbw at 4 MiB against 67-78 with every receive posted at once,
      85-106 against 71-80 at 16 MiB; on 4 hosts 112-116 against 86-112
      at 4 MiB, alike at 16 MiB.
    * receives_first=False (large tensors, threads at normal priority): each
      step posts its send, then its receive. In a pairwise exchange the peer
      usually has not posted its receive yet, so the payload is written by
      gloo's I/O thread, which reads and writes the connection in one
      thread. Had the receive been posted first, our thread would write the
      payload itself while the peer's data arrives on the same connection,
      and gloo's I/O thread spins on the connection's lock until the write
      is done (measured on an AMD EPYC VM: ~60% more CPU for a 4 MiB
      exchange, which an oversubscribed machine pays in time). With the threads at real-time
      priority, receives first measured faster at every size all the same.

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
