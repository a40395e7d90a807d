"""What the tuned all-reduces share: a rank's view of its group (Comm), where
the data travels from, and what a thread keeps between calls (scratch
buffers, each group's Comm, prepared calls). What they are told about the
machine is a TunedPlan (plan.py).

A tuned algorithm is a function `algorithm(flat, comm, plan)` that reduces
the 1-D contiguous tensor `flat` in place; run_on_comm_device() wraps it into
the public `fn(tensor, group=None, plan=TunedPlan()) -> tensor`.
"""
from __future__ import annotations

import collections
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ddp_lab.collectives.basics import check_tensor, group_rank, stages_through_host
from ddp_lab.collectives.tuned.plan import TunedPlan

_CPU = torch.device("cpu")


# ------------------------------------------------ kept between calls, per thread

# Host scratch buffers, kept between calls (per thread, per purpose and
# dtype). A fresh large CPU tensor costs a page fault per 4 KiB page on
# first touch, which took longer than adding the data (the lab notebook's
# "Interleaved timings against gloo on the earlier machines", in git:
# git show dac1b7d:docs/lab_notebook.md). The price
# is memory: each thread that reduces keeps about the largest tensor it
# reduced (twice that at naive's root), until free_scratch_buffers().
# The same per-thread store keeps each group's Comm (comm_of) and the last
# few prepared calls (prepared).
per_thread = threading.local()
# Prepared calls kept per thread: enough for the one flat gradient buffer, or
# a few DDP buckets, reduced every step.
PREPARED_CALLS_KEPT = 4


def scratch(numel: int, like: torch.Tensor, purpose: str = "work") -> torch.Tensor:
    """A 1-D buffer of `numel` elements of like's dtype and device.

    CPU buffers are reused by later calls in the same thread: a caller must
    be done with its buffer (every receive into it waited for) before it
    returns. CUDA tensors come from PyTorch's caching allocator anyway.
    """
    if like.device.type != "cpu":
        return like.new_empty(numel)
    cache = per_thread.__dict__.setdefault("buffers", {})
    key = (purpose, like.dtype)
    buf = cache.get(key)
    if buf is None or buf.numel() < numel:
        cache.pop(key, None)  # free the old one before allocating its successor
        buf = cache[key] = like.new_empty(numel)
    return buf[:numel]


def free_scratch_buffers() -> None:
    """Release what this thread keeps between calls: host scratch buffers,
    prepared calls (and with them the tensors they were prepared for) and
    each group's Comm."""
    per_thread.__dict__.clear()


def prepared(flat: torch.Tensor, comm: Comm, plan: TunedPlan,
             prepare: Callable[[torch.Tensor, Comm, TunedPlan], Any]) -> Any:
    """prepare(flat, comm, plan), or what it returned when last called for this
    buffer, group and plan.

    Training reduces the same gradient buffers every step, and working out a
    ring call's messages (segment bounds, a tensor view per message) is
    Python work on the critical path: with 3-4 ranks sharing 2 cores, each
    rank's delay before and between its sends holds up its neighbours too,
    so the prepared calls are kept, with the group's Comm (see comm_of).
    Measurements: the lab notebook's "Interleaved timings against gloo on
    the earlier machines" (git show dac1b7d:docs/lab_notebook.md); for
    halving-doubling see halving_doubling.py.

    The key is the buffer's address, length, dtype and device, the group
    and the plan: the views kept hold the buffer's memory, so no other
    tensor can take that address while its entry lives. The price is memory: the last
    PREPARED_CALLS_KEPT buffers a thread reduced stay allocated until they
    drop out or free_scratch_buffers() is called.
    """
    calls = per_thread.__dict__.setdefault("prepared", collections.OrderedDict())
    key = (prepare, flat.data_ptr(), flat.numel(), flat.dtype, flat.device, comm, plan)
    call = calls.get(key)
    if call is None:
        call = calls[key] = prepare(flat, comm, plan)
        if len(calls) > PREPARED_CALLS_KEPT:
            calls.popitem(last=False)
    else:
        calls.move_to_end(key)
    return call


# ------------------------------------------------------------ a rank's group


class Comm:
    """This rank's view of `group`: group rank, size, and peer translation.

    Peers are always *group* ranks: on gloo, messages are posted on the
    group's gloo backend itself (``comm.gloo.send([t], group_rank, tag)``,
    which is where ``dist.isend`` ends up), skipping ``dist.isend``'s own
    argument handling and the ProcessGroup's dispatch to its backend (see
    `gloo`): a small exchange then costs about 30% less (the lab notebook's
    "Interleaved timings against gloo on the earlier machines", in git: git
    show dac1b7d:docs/lab_notebook.md). On NCCL,
    `exchange` translates them to the global ranks that dist.P2POp expects.
    """

    def __init__(self, group: dist.ProcessGroup | None, batched: bool):
        self.size = dist.get_world_size(group)
        self.rank = group_rank(group)
        # The group (None: the default one) and the ProcessGroup whose
        # send/recv take group ranks (gloo path), held weakly: a Comm is kept
        # between calls (comm_of) and must not keep a destroyed group (its
        # threads, its sockets) alive until the interpreter exits.
        # global_ranks[r] = dist.get_global_rank(group, r) for the P2POps of
        # the NCCL path, looked up once.
        self._group = None if group is None else weakref.ref(group)
        self._pg = weakref.ref(group if group is not None else dist.group.WORLD)
        if group is None:
            self.global_ranks = list(range(self.size))
        else:
            self.global_ranks = dist.get_process_group_ranks(group)
        # True for CUDA tensors on NCCL only (gloo stages them through the
        # host first): exchanges are then launched as batches.
        self.batched = batched

    @property
    def group(self) -> dist.ProcessGroup | None:
        return None if self._group is None else self._group()

    @property
    def pg(self) -> dist.ProcessGroup | None:
        """The ProcessGroup, or None once it has been destroyed and freed."""
        return self._pg()

    @property
    def gloo(self):
        """What gloo sends and receives are posted on: the group's gloo
        backend (ProcessGroupGloo) itself, where torch exposes it, else the
        ProcessGroup, which dispatches to it.

        Each message saves the dispatch, through a private torch method
        (`_get_backend`), kept only because it measured faster per receive
        posted. Looked up on every use (a fraction of a microsecond) rather than kept, like the
        group itself, so that a kept Comm never holds a destroyed group's
        backend.
        """
        pg = self._pg()
        try:
            return pg._get_backend(_CPU)
        except (AttributeError, RuntimeError):  # no such method, or no CPU backend
            return pg

    def exchange(
        self,
        recv: tuple[torch.Tensor, int] | None,
        send: tuple[torch.Tensor, int] | None,
        tag: int,
    ) -> tuple[list[dist.Work], list[dist.Work]]:
        """Post a receive (into tensor, from peer) and/or a send (tensor, to peer).

        Returns (works to wait for the receive, works to wait for the send).
        An empty tensor is not posted at all: both sides compute the same
        sizes, so the peer skips the matching operation too.

        On NCCL both are launched as one batch_isend_irecv, because a ring of
        ranks that each launch a blocking send before their receive
        deadlocks; the batch then has a single work, returned as the receive's
        (waiting for it covers the send). Elsewhere they are posted one by one,
        which is cheaper and lets the caller wait for the receive alone.
        """
        if recv is not None and recv[0].numel() == 0:
            recv = None
        if send is not None and send[0].numel() == 0:
            send = None
        if self.batched:
            ops = []
            if recv is not None:
                ops.append(dist.P2POp(dist.irecv, recv[0], self.global_ranks[recv[1]], self.group, tag))
            if send is not None:
                ops.append(dist.P2POp(dist.isend, send[0], self.global_ranks[send[1]], self.group, tag))
            works = dist.batch_isend_irecv(ops) if ops else []
            return (works, []) if recv is not None else ([], works)
        recv_works, send_works = [], []
        if recv is not None:
            recv_works.append(self.gloo.recv([recv[0]], recv[1], tag))
        if send is not None:
            send_works.append(self.gloo.send([send[0]], send[1], tag))
        return recv_works, send_works

    def isend(self, tensor: torch.Tensor, peer: int, tag: int) -> dist.Work | None:
        """Send to group rank `peer` (as dist.isend); nothing (None) for an empty tensor.
        Not for NCCL."""
        if tensor.numel() == 0:
            return None
        return self.gloo.send([tensor], peer, tag)

    def irecv(self, tensor: torch.Tensor, peer: int, tag: int) -> dist.Work | None:
        """Receive from group rank `peer` (as dist.irecv); nothing (None) for an empty
        tensor. Not for NCCL."""
        if tensor.numel() == 0:
            return None
        return self.gloo.recv([tensor], peer, tag)

    def sendrecv(self, recv, send, tag: int) -> None:
        """exchange() and wait for both."""
        recv_works, send_works = self.exchange(recv, send, tag)
        wait_all(recv_works)
        wait_all(send_works)


def comm_of(group: dist.ProcessGroup | None, batched: bool) -> Comm:
    """This thread's Comm for `group`, made on first use and kept.

    Looking the group's size, rank and peers up again on every call costs
    little on an idle machine, but where ranks share cores everything a rank
    does before its first send delays its neighbours too (see prepared).
    """
    pg = group if group is not None else dist.group.WORLD
    comms = per_thread.__dict__.setdefault("comms", {})
    key = (id(pg), batched)
    comm = comms.get(key)
    if comm is None or comm.pg is not pg:  # none yet, or a destroyed group's
        if len(comms) >= 8:  # groups destroyed and made again: drop the old ones
            comms.clear()
        comm = comms[key] = Comm(group, batched)
    return comm


def wait_all(works: list[dist.Work]) -> None:
    for w in works:
        w.wait()


# ------------------------------------------------------------ where it runs


def run_on_comm_device(
    tensor: torch.Tensor,
    group: dist.ProcessGroup | None,
    plan: TunedPlan,
    algorithm: Callable[[torch.Tensor, Comm, TunedPlan], None],
) -> torch.Tensor:
    """Validate, pick where the data travels from, run `algorithm`, copy back.

    `algorithm(flat, comm, plan)` reduces the 1-D contiguous tensor `flat` in
    place. A CUDA tensor goes straight to the algorithm when the group's
    backend is NCCL; otherwise (gloo) it is staged through a host copy,
    because gloo's send/recv only handle CPU tensors.
    """
    check_tensor(tensor)
    staged = stages_through_host(tensor, group)
    comm = comm_of(group, batched=tensor.device.type == "cuda" and not staged)
    if comm.size == 1:
        return tensor
    # detach(): gradients are usually leaves that require grad; the reduction
    # itself is not part of any autograd graph.
    flat = tensor.detach().view(-1)
    if flat.numel() == 0:
        # Every rank knows the size is zero (sizes must agree for any
        # all-reduce), so nothing is sent at all.
        return tensor
    if staged:
        host = scratch(flat.numel(), torch.empty(0, dtype=flat.dtype), "staging").copy_(flat)
        algorithm(host, comm, plan)
        flat.copy_(host)
    else:
        algorithm(flat, comm, plan)
    return tensor
