"""All-reduce (SUM, in place) written with point-to-point messages.

Each function has the signature ``fn(tensor, group=None) -> tensor``: it sums
``tensor`` across the ranks of ``group`` (the default group when None),
overwrites it with the result on every rank and returns the same object, so
they can stand in for ``dist.all_reduce(tensor, group=group)``.

Cost model for n ranks and an N-byte message: alpha is the per-message
latency, beta the time per byte on a link, gamma the time per byte to add.

``naive_allreduce`` -- everyone sends to group rank 0, which adds and sends
    the sum back (the "sum on device 0, copy back" textbook scheme). The root
    handles every byte: 2(n-1)*(alpha + N*beta) + (n-1)*N*gamma at the root,
    so it gets slower linearly with n.

``ring_allreduce`` -- the data is cut into n chunks; a reduce-scatter passes
    chunks around the ring (each rank adds what it receives and forwards it)
    until every rank owns one fully summed chunk, then an all-gather passes
    the summed chunks around once more.
    2(n-1)*alpha + 2(n-1)/n*N*beta + (n-1)/n*N*gamma:
    the bandwidth term does not grow with n (bandwidth-optimal), but the
    latency term does, so it is the algorithm for large messages. Chunks are
    further cut into segments so that receiving one segment, adding another
    and forwarding a third overlap; how small, and how many are in flight,
    depends on what a message costs, which on gloo depends on how its threads
    are scheduled (_ring_plan).

``halving_doubling_allreduce`` -- Rabenseifner: a reduce-scatter by recursive
    vector halving (exchange half the current window with the partner at
    distance p/2, p/4, ..., 1) then an all-gather by recursive doubling.
    2*log2(n)*alpha + 2(n-1)/n*N*beta + (n-1)/n*N*gamma:
    the same bandwidth term as the ring with 2*log2(n) instead of 2(n-1)
    latencies, so it suits small and medium messages. When n is not a power
    of two, the first 2*(n-p) ranks (p the largest power of two <= n) fold in
    pairwise first and the idle rank of each pair gets the result at the end,
    which costs two more full-message steps (alpha + N*beta each) and one
    more addition.

``builtin_allreduce`` -- ``dist.all_reduce``: the reference the others are
    checked and timed against.

Shared rules:

* Supported dtypes: float32, float64, bfloat16, float16. bfloat16/float16 are
  accumulated in their own dtype (every addition rounds to it; no wider
  accumulator), as gloo's own all-reduce does. Results can therefore differ
  from ``dist.all_reduce`` in the last bits, because the summation order
  differs; for n ranks the error stays within n * unit-roundoff * sum|x_i|.
  Integer and bool tensors raise TypeError rather than risk silent overflow
  or a meaningless "sum" of bools.
* The tensor must be contiguous (the algorithms send views of its flat
  storage); otherwise ValueError.
* Ranks are group ranks (``dist.get_rank(group)``), so subgroups work. On
  gloo, messages are posted on the group's ProcessGroup object itself
  (``pg.send([t], group_rank, tag)``, which is where ``dist.isend`` ends up),
  skipping ``dist.isend``'s own argument handling: on the 2-core test machine
  an exchange of 16 floats took 111 us instead of 157; at 1-8 MiB the
  difference was within the noise.
* Every rank computes the same chunk boundaries, so the two sides of a
  message always agree on its size; empty pieces are skipped on both sides
  (never a zero-length message that the peer does not expect).
* Tags keep messages apart: one tag per phase (naive), per phase and level
  (halving-doubling) or per message (ring), and between a pair of ranks
  messages are posted in the same order on both sides, so no receive can
  match a message meant for another phase or step.
* On gloo, a CUDA tensor is copied to the host, reduced there (gloo's
  point-to-point is CPU only) and copied back. On NCCL, CUDA tensors are
  used directly and every exchange is posted with ``dist.batch_isend_irecv``
  so that a rank's send and receive of a step are launched together (NCCL
  would otherwise deadlock a ring of blocking sends).
"""
from __future__ import annotations

import collections
import threading
import weakref
from typing import Any, Callable, NamedTuple

import torch
import torch.distributed as dist

from ddp_lab.distributed import at_comm_priority, comm_threads_of_group

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

SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)

# Tags name the exchanges, so a message can never be matched by a receive
# meant for another phase or step (gloo matches by peer and tag, in posting
# order; NCCL ignores tags and relies on the posting order alone).
_TAG_NAIVE_GATHER = 101
_TAG_NAIVE_BCAST = 102
_TAG_RING = 1000  # + unit index: each ring message has its own tag
_TAG_HD_FOLD_IN = 201
_TAG_HD_FOLD_OUT = 202
_TAG_HD_RS = 300  # + level (< 64)
_TAG_HD_AG = 400  # + level

# Ring segment size on the host (gloo/TCP), by how gloo's threads are
# scheduled (dist.comm_threads), because that sets what a message costs.
# Smaller segments overlap transfer, addition and forwarding better and stay
# in cache between arriving and being added, but every message has a fixed
# cost: thread wake-ups and lock hand-offs on both sides, and Python.
# * normal: a woken thread may wait for a scheduler tick on a busy machine.
#   On 2 cores with 2-4 processes, one message per chunk up to 4 MiB was as
#   fast as 1 MiB segments or faster, and 256 KiB segments were clearly
#   slower (0.6-0.75x gloo's own all-reduce at 4-16 MiB with 512 KiB).
# * realtime: hand-offs are immediate, so smaller segments pay off, two
#   units in flight (_RING_WINDOW_REALTIME), as gloo's own ring does. Against
#   4 MiB segments on the same machine, 512 KiB took the ring from 0.75-0.91x
#   of gloo's all-reduce to 0.96-1.26x (2 ranks, 4-16 MiB) and from 0.77-0.86x
#   to 0.91-0.92x (3 and 4 ranks, 16 MiB); 768 KiB did as well at 2 ranks and
#   better at 3 and 4 at 1-4 MiB (one launch of 15 rounds: 0.87-0.88 against
#   0.74-0.85 at 3 ranks), and 256 KiB was slower again.
# Chunks above the size are cut into near-equal segments of at most this
# size. See _ring_plan. These knobs are read when a ring call on a buffer is
# prepared (see _prepared); after changing them, free_scratch_buffers().
_RING_SEGMENT_BYTES = {"normal": 4 * 1024 * 1024, "realtime": 768 * 1024}
_RING_WINDOW_REALTIME = 2
# Upper bound on the ring's receive scratch space on the host (see _ring).
_RING_MAX_SCRATCH_BYTES = 256 * 1024 * 1024
# Pairwise exchanges on gloo (halving-doubling, the 2-rank ring, naive) with
# 3+ ranks post all their receives first for tensors up to this size, and
# each send before its receive above it. See _receives_first and _run_steps.
_EARLY_RECV_MAX_BYTES = 1024 * 1024


# ---------------------------------------------------------------- helpers

# Host scratch buffers, kept between calls (per thread, per purpose and
# dtype). A fresh large CPU tensor costs a page fault per 4 KiB page on
# first touch: on the 2-core test machine a fresh 32 MiB buffer took 15 ms
# more to fill than a reused one, more than the time to add 32 MiB, and
# made the ring 1.5x slower than gloo's own all-reduce at 64 MiB. The price
# is memory: each thread that reduces keeps about the largest tensor it
# reduced (twice that at naive's root), until free_scratch_buffers().
# The same per-thread store keeps each group's _Comm and the last few
# prepared ring calls (see _prepared).
_per_thread = threading.local()
# Prepared calls kept per thread: enough for the one flat gradient buffer, or
# a few DDP buckets, reduced every step.
_PREPARED_CALLS_KEPT = 4


def _scratch(numel: int, like: torch.Tensor, purpose: str = "work") -> torch.Tensor:
    """A 1-D buffer of `numel` elements of like's dtype and device.

    CPU buffers are reused by later calls in the same thread: a caller must
    be done with its buffer (every receive into it waited for) before it
    returns. CUDA tensors come from PyTorch's caching allocator anyway.
    """
    if like.device.type != "cpu":
        return like.new_empty(numel)
    cache = _per_thread.__dict__.setdefault("buffers", {})
    key = (purpose, like.dtype)
    buf = cache.get(key)
    if buf is None or buf.numel() < numel:
        cache.pop(key, None)  # free the old one before allocating its successor
        buf = cache[key] = like.new_empty(numel)
    return buf[:numel]


def free_scratch_buffers() -> None:
    """Release what this thread keeps between calls: host scratch buffers,
    prepared calls (and with them the tensors they were prepared for) and
    each group's _Comm."""
    _per_thread.__dict__.clear()


def _check_tensor(tensor: torch.Tensor) -> None:
    """Reject inputs the algorithms would get silently wrong."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d).replace("torch.", "") for d in SUPPORTED_DTYPES)
        raise TypeError(
            f"all-reduce of a {str(tensor.dtype).replace('torch.', '')} tensor is not "
            f"supported; supported dtypes: {names}"
        )
    if not tensor.is_contiguous():
        raise ValueError(
            f"tensor of shape {tuple(tensor.shape)} with strides {tuple(tensor.stride())} "
            "is not contiguous; call .contiguous() first (and copy the result back "
            "into the original if you need it there)"
        )


def _chunk_bounds(numel: int, parts: int) -> list[int]:
    """Boundaries of `parts` near-equal pieces of range(numel): parts+1 ints.

    The first numel % parts pieces get one extra element; when numel < parts
    the trailing pieces are empty. Every rank computes the same list.
    """
    base, extra = divmod(numel, parts)
    bounds = [0]
    for i in range(parts):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    return bounds


class _Comm:
    """This rank's view of `group`: group rank, size, and peer translation.

    `exchange` takes *group* ranks and translates them to the global ranks
    that dist.isend/irecv expect.
    """

    def __init__(self, group: dist.ProcessGroup | None, batched: bool):
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if self.rank < 0:
            raise ValueError("this process is not a member of the given group")
        # The group (None: the default one) and the ProcessGroup whose
        # send/recv take group ranks (gloo path), held weakly: a _Comm is kept
        # between calls (_comm_of) and must not keep a destroyed group (its
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
        # How gloo's threads are scheduled ("realtime" or "normal",
        # dist.comm_threads): it decides how the ring cuts its messages. It is
        # the default group's setting; a group made later with new_group has
        # threads at normal priority but gets the same plan (correct either
        # way, only the speed differs).
        self.threads = comm_threads_of_group()

    @property
    def group(self) -> dist.ProcessGroup | None:
        return None if self._group is None else self._group()

    @property
    def pg(self) -> dist.ProcessGroup | None:
        """The ProcessGroup, or None once it has been destroyed and freed."""
        return self._pg()

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
            recv_works.append(self.pg.recv([recv[0]], recv[1], tag))
        if send is not None:
            send_works.append(self.pg.send([send[0]], send[1], tag))
        return recv_works, send_works

    def isend(self, tensor: torch.Tensor, peer: int, tag: int) -> dist.Work | None:
        """Send to group rank `peer` (as dist.isend); nothing (None) for an empty tensor.
        Not for NCCL."""
        if tensor.numel() == 0:
            return None
        return self.pg.send([tensor], peer, tag)

    def irecv(self, tensor: torch.Tensor, peer: int, tag: int) -> dist.Work | None:
        """Receive from group rank `peer` (as dist.irecv); nothing (None) for an empty
        tensor. Not for NCCL."""
        if tensor.numel() == 0:
            return None
        return self.pg.recv([tensor], peer, tag)

    def sendrecv(self, recv, send, tag: int) -> None:
        """exchange() and wait for both."""
        recv_works, send_works = self.exchange(recv, send, tag)
        _wait(recv_works)
        _wait(send_works)


def _comm_of(group: dist.ProcessGroup | None, batched: bool) -> _Comm:
    """This thread's _Comm for `group`, made on first use and kept.

    Looking the group's size, rank and peers up again on every call costs
    little on an idle machine, but where ranks share cores everything a rank
    does before its first send delays its neighbours too (see _prepared).
    """
    pg = group if group is not None else dist.group.WORLD
    comms = _per_thread.__dict__.setdefault("comms", {})
    key = (id(pg), batched)
    comm = comms.get(key)
    if comm is None or comm.pg is not pg:  # none yet, or a destroyed group's
        if len(comms) >= 8:  # groups destroyed and made again: drop the old ones
            comms.clear()
        comm = comms[key] = _Comm(group, batched)
    return comm


def _receives_first(flat: torch.Tensor, comm: _Comm) -> bool:
    """Whether a pairwise exchange on gloo posts all its receives before any send.

    Measured on 2 cores (interleaved rounds against dist.all_reduce): with 4
    ranks, receives first made halving-doubling 1.1-1.3x faster up to 1 MiB;
    with 2 ranks it made every size slower, up to 3x at 16 KiB (0.6x of
    gloo's own all-reduce instead of 1.0x). With only two processes, each
    blocked on the other, a send that goes out at once beats one whose
    receive was announced first: see _run_steps for what each costs.
    """
    return comm.size > 2 and flat.numel() * flat.element_size() <= _EARLY_RECV_MAX_BYTES


def _wait(works: list[dist.Work]) -> None:
    for w in works:
        w.wait()


def _run_on_comm_device(
    tensor: torch.Tensor,
    group: dist.ProcessGroup | None,
    algorithm: Callable[[torch.Tensor, _Comm], None],
) -> torch.Tensor:
    """Validate, pick where the data travels from, run `algorithm`, copy back.

    `algorithm(flat, comm)` reduces the 1-D contiguous tensor `flat` in place.
    A CUDA tensor goes straight to the algorithm when the group's backend is
    NCCL; otherwise (gloo) it is staged through a host copy, because gloo's
    send/recv only handle CPU tensors.
    """
    _check_tensor(tensor)
    on_nccl = tensor.device.type == "cuda" and "nccl" in str(dist.get_backend(group)).lower()
    comm = _comm_of(group, batched=on_nccl)
    if comm.size == 1:
        return tensor
    # detach(): gradients are usually leaves that require grad; the reduction
    # itself is not part of any autograd graph.
    flat = tensor.detach().view(-1)
    if flat.numel() == 0:
        # Every rank knows the size is zero (sizes must agree for any
        # all-reduce), so nothing is sent at all.
        return tensor
    if on_nccl:
        algorithm(flat, comm)
    elif tensor.device.type == "cpu":
        with at_comm_priority():  # gloo's threads must not outrank this one (dist.comm_threads)
            algorithm(flat, comm)
    else:
        host = _scratch(flat.numel(), torch.empty(0, dtype=flat.dtype), "staging").copy_(flat)
        with at_comm_priority():
            algorithm(host, comm)
        flat.copy_(host)
    return tensor


# ------------------------------------------------------------- algorithms


def builtin_allreduce(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """dist.all_reduce(SUM): the backend's own algorithm, used as the reference."""
    _check_tensor(tensor)
    if dist.get_world_size(group) > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    return tensor


def _naive(flat: torch.Tensor, comm: _Comm) -> None:
    n, rank = comm.size, comm.rank
    if rank != 0:
        # Receiving the result into `flat` while it is being sent is safe:
        # the root only replies once it has received everything.
        _run_steps(comm, [_Step(0, _TAG_NAIVE_GATHER, send=flat, recv=None),
                          _Step(0, _TAG_NAIVE_BCAST, send=None, recv=flat)],
                   receives_first=_receives_first(flat, comm))
        return
    # Root: two scratch buffers (one if there is a single sender), so the
    # message from rank i+1 is arriving while the one from rank i is added.
    slots = min(2, n - 1)
    buf = _scratch(slots * flat.numel(), flat)
    scratch = [buf[i * flat.numel(): (i + 1) * flat.numel()] for i in range(slots)]
    pending, _ = comm.exchange((scratch[0], 1), None, _TAG_NAIVE_GATHER)
    for src in range(1, n):
        _wait(pending)
        if src + 1 < n:
            nxt = scratch[src % len(scratch)]
            pending, _ = comm.exchange((nxt, src + 1), None, _TAG_NAIVE_GATHER)
        flat.add_(scratch[(src - 1) % len(scratch)])
    sends = []
    for dst in range(1, n):
        recv_works, send_works = comm.exchange(None, (flat, dst), _TAG_NAIVE_BCAST)
        sends += recv_works + send_works
    _wait(sends)


def naive_allreduce(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Gather to group rank 0, add there, send the sum back to everyone."""
    return _run_on_comm_device(tensor, group, _naive)


class _RingPlan(NamedTuple):
    """How the ring cuts and paces its messages (see _ring_plan)."""

    segments: int  # per chunk (k); one unit = one segment sent and one received
    window: int  # units in flight: unit u is posted once unit u-window is finished (<= k)
    send_first: bool  # within a unit, post the send before the receive
    receives_ahead: bool  # post (almost) every receive before the first send (implies send_first)


def _ring_plan(comm: _Comm, chunk_numel: int, element_size: int) -> _RingPlan:
    """Segments and pacing for this call, from where the data is and how the
    threads that move it are scheduled (measured on 2 cores, 2-4 processes).

    * NCCL: one message per chunk, each launched with its receive; NCCL
      pipelines internally, and each extra message is a kernel launch.
      Receives are not posted ahead: every rank's stream would then wait on
      a receive whose matching send is queued behind it on the sender's.
    * gloo, real-time threads: segments of at most 768 KiB, two units in
      flight, each unit's receive posted before its send, as gloo's own ring
      does: with no scheduling delays, small messages are cheap.
    * gloo, normal threads: segments of at most 4 MiB. With 3+ ranks every
      receive is posted before the first send: on gloo's TCP transport a
      send whose receive is already posted on the other side goes out at
      once from the sending thread; otherwise it announces itself and waits
      for a "ready" reply, several thread wake-ups. With 2 ranks both
      neighbours are the same peer, a pairwise exchange: send before
      receive, k units in flight (see _receives_first).
    """
    if comm.batched:
        return _RingPlan(segments=1, window=1, send_first=False, receives_ahead=False)
    seg_bytes = _RING_SEGMENT_BYTES[comm.threads]
    k = max(1, -(-chunk_numel * element_size // seg_bytes))
    if comm.threads == "realtime":
        return _RingPlan(k, min(k, _RING_WINDOW_REALTIME), send_first=False, receives_ahead=False)
    if comm.size == 2:
        return _RingPlan(k, k, send_first=True, receives_ahead=False)
    return _RingPlan(k, k, send_first=True, receives_ahead=True)


class _RingCall(NamedTuple):
    """One rank's messages for a ring all-reduce of one buffer (see _prepare_ring)."""

    plan: _RingPlan
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


def _prepare_ring(flat: torch.Tensor, comm: _Comm) -> _RingCall:
    n, rank = comm.size, comm.rank
    chunks = _chunk_bounds(flat.numel(), n)
    plan = _ring_plan(comm, chunks[1] - chunks[0], flat.element_size())
    k, window = plan.segments, plan.window
    # seg[c][j] = (start, stop) of segment j of chunk c. Every chunk gets the
    # same number of segments (some possibly empty), so both neighbours agree
    # on the size of every message.
    seg = []
    for c in range(n):
        b = _chunk_bounds(chunks[c + 1] - chunks[c], k)
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
        # takes more than _RING_MAX_SCRATCH_BYTES; then slots are reused, and
        # the receive for a slot is posted once the previous unit in it has
        # been added.
        cap = max(1, _RING_MAX_SCRATCH_BYTES // max(1, seg_numel * flat.element_size()))
        slots = min(rs_units, max(2 * k, cap))
    else:
        # Unit u's slot was last used by unit u-window, finished before u is
        # posted. (NCCL: stream order makes that safe as well.)
        slots = window
    scratch = _scratch(slots * seg_numel, flat)

    sends, recvs, adds = [], [], []
    for u in range(units):
        s, j = divmod(u, k)
        if s < n - 1:
            (sa, sb), (ra, rb) = seg[(rank - s) % n][j], seg[(rank - s - 1) % n][j]
            slot = (u % slots) * seg_numel
            incoming = scratch[slot: slot + rb - ra]
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


def _prepared(flat: torch.Tensor, comm: _Comm, prepare: Callable[[torch.Tensor, _Comm], Any]) -> Any:
    """prepare(flat, comm), or what it returned when last called for this buffer.

    Training reduces the same gradient buffers every step, and working out a
    ring call's messages (segment bounds, a tensor view per message) is
    Python work on the critical path: with 3-4 ranks sharing 2 cores, each
    rank's delay before and between its sends holds up its neighbours too.
    Keeping the prepared calls (with the group's _Comm, see _comm_of) took
    the ring from 0.87-1.00x of gloo's all-reduce to 0.97-1.13x at 1-2 MiB,
    and from 0.77-0.88x to 0.85-0.96x at 4 MiB (3 and 4 ranks, old and new
    code in the same interleaved rounds, three launches each).

    The key is the buffer's address, length, dtype and device, and the
    group: the views kept hold the buffer's memory, so no other tensor can
    take that address while its entry lives. The price is memory: the last
    _PREPARED_CALLS_KEPT buffers a thread reduced stay allocated until they
    drop out or free_scratch_buffers() is called.
    """
    calls = _per_thread.__dict__.setdefault("prepared", collections.OrderedDict())
    key = (prepare, flat.data_ptr(), flat.numel(), flat.dtype, flat.device, comm)
    call = calls.get(key)
    if call is None:
        call = calls[key] = prepare(flat, comm)
        if len(calls) > _PREPARED_CALLS_KEPT:
            calls.popitem(last=False)
    else:
        calls.move_to_end(key)
    return call


def _ring(flat: torch.Tensor, comm: _Comm) -> None:
    call = _prepared(flat, comm, _prepare_ring)
    plan, left, right = call.plan, call.left, call.right
    k, window, slots, rs_units = plan.segments, plan.window, call.slots, call.rs_units
    sends, recvs, adds = call.sends, call.recvs, call.adds
    units = len(sends)
    pg = comm.pg
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
                recv_works[u] = pg.recv([recvs[u]], left, _TAG_RING + u)

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
        recv, send, tag = recvs[u], sends[u], _TAG_RING + u
        if comm.batched:
            recv_list, send_list = comm.exchange(None if recv is None else (recv, left),
                                                 None if send is None else (send, right), tag)
            recv_works[u] = recv_list[0] if recv_list else None
            send_works.extend(send_list)
            continue
        if send is not None and plan.send_first:
            send_works.append(pg.send([send], right, tag))
        if plan.receives_ahead:
            # The scratch slot of unit u-k is free again: receive into it.
            ahead = u - k + slots
            if u >= k and ahead < rs_units and recvs[ahead] is not None:
                recv_works[ahead] = pg.recv([recvs[ahead]], left, _TAG_RING + ahead)
        elif recv is not None:
            recv_works[u] = pg.recv([recv], left, tag)
        if send is not None and not plan.send_first:
            send_works.append(pg.send([send], right, tag))
    _wait(send_works)


def ring_allreduce(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Ring reduce-scatter + all-gather, pipelined in segments."""
    return _run_on_comm_device(tensor, group, _ring)


class _Step(NamedTuple):
    """One exchange with one peer: send `send`, receive into `recv`, then
    (optionally) add what was received into `add_into`. Either side may be
    None. `tag` names the exchange, identically on both peers."""

    peer: int
    tag: int
    send: torch.Tensor | None
    recv: torch.Tensor | None
    add_into: torch.Tensor | None = None


def _run_steps(comm: _Comm, steps: list[_Step], receives_first: bool) -> None:
    """Run a sequence of exchanges, each step's send after the previous step's add.

    On gloo's TCP transport a send whose receive is already posted on the
    other side goes out at once, from the sending thread; otherwise it
    announces itself and the payload follows when the receiver replies
    "ready", written by gloo's I/O thread. Which is cheaper depends on size:

    * receives_first=True (small tensors): every receive is posted before
      anything is sent, so each step costs one message latency, not three.
      Each receive then needs its own buffer, and data arriving early must
      never overwrite something still to be sent (the callers guarantee it:
      such data can only arrive after the peer got what it needed from us).
    * receives_first=False (large tensors): each step posts its send, then its
      receive. In a pairwise exchange the peer usually has not posted its
      receive yet, so the payload is written by gloo's I/O thread, which
      reads and writes the connection in one thread. Had the receive been
      posted first, our thread would write the payload itself while the
      peer's data arrives on the same connection, and gloo's I/O thread spins
      on the connection's lock until the write is done (measured: ~60% more
      CPU for a 4 MiB exchange, which an oversubscribed machine pays in time).

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
    if receives_first:
        for i in reversed(range(len(steps))):  # the first step's data comes first
            if steps[i].recv is not None:
                recv_works[i] = comm.irecv(steps[i].recv, steps[i].peer, steps[i].tag)
    send_works: list[dist.Work] = []
    for i, st in enumerate(steps):
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
    _wait(send_works)


def _halving_doubling(flat: torch.Tensor, comm: _Comm) -> None:
    n, rank = comm.size, comm.rank
    p = 1 << (n.bit_length() - 1)  # largest power of two <= n
    rem = n - p
    steps: list[_Step] = []

    # Fold-in: among the first 2*rem ranks, each even rank hands its data to
    # the odd rank above it and sits out until the result comes back; the p
    # ranks left are renumbered 0..p-1 and run the power-of-two algorithm.
    receives_first = _receives_first(flat, comm)
    if rank < 2 * rem and rank % 2 == 0:
        steps.append(_Step(rank + 1, _TAG_HD_FOLD_IN, send=flat, recv=None))
        steps.append(_Step(rank + 1, _TAG_HD_FOLD_OUT, send=None, recv=flat))
        _run_steps(comm, steps, receives_first)
        return
    # Chunk c of p covers bounds[c]:bounds[c+1]; after the reduce-scatter
    # new rank r owns the sum of chunk r.
    bounds = _chunk_bounds(flat.numel(), p)
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
    if receives_first:
        scratch = _scratch(sum(sizes) + (flat.numel() if fold else 0), flat)
    else:
        scratch = _scratch(max(sizes + [flat.numel() if fold else 0]), flat)
    offset = 0
    if fold:
        steps.append(_Step(rank - 1, _TAG_HD_FOLD_IN, send=None,
                           recv=scratch[: flat.numel()], add_into=flat))
        offset = flat.numel() if receives_first else 0
    for level, ((partner, (ka, kb), (ga, gb)), size) in enumerate(zip(halving, sizes)):
        steps.append(_Step(partner, _TAG_HD_RS + level, send=flat[ga:gb],
                           recv=scratch[offset: offset + size], add_into=flat[ka:kb]))
        if receives_first:
            offset += size

    # All-gather by recursive doubling: swap windows with the partner at
    # distance 1, 2, ..., p/2, receiving the partner's window in place; ours
    # doubles each step.
    for level in range(p.bit_length() - 1):
        mask = 1 << level
        width = hi - lo
        other = (lo - width, lo) if new_rank & mask else (hi, hi + width)
        steps.append(_Step(group_rank(new_rank ^ mask), _TAG_HD_AG + level,
                           send=flat[bounds[lo]:bounds[hi]],
                           recv=flat[bounds[other[0]]:bounds[other[1]]]))
        lo, hi = min(lo, other[0]), max(hi, other[1])

    # Fold-out: hand the result to the rank that sat out.
    if rank < 2 * rem:
        steps.append(_Step(rank - 1, _TAG_HD_FOLD_OUT, send=flat, recv=None))
    _run_steps(comm, steps, receives_first)


def halving_doubling_allreduce(
    tensor: torch.Tensor, group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """Rabenseifner: recursive-halving reduce-scatter + recursive-doubling all-gather."""
    return _run_on_comm_device(tensor, group, _halving_doubling)


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
