"""sync=flat: every gradient a view into persistent flat buffers, one all-reduce per buffer.

The buffers hold the model's last parameters first, as the backward fills them; with sync.algo=builtin each
buffer's all-reduce starts as soon as the backward has filled it and runs on gloo's (NCCL's) thread while the
rest of the backward computes, as DDP's buckets do; after the backward the step waits for them. A model whose
gradients fit one buffer (LeNet's) has nothing to overlap: one all-reduce after the backward.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ddp_lab.config.keys import key
from ddp_lab.distributed import DistEnv
from ddp_lab.sync.base import NO_CONTEXT, Capabilities, SyncContext, broadcast_from_rank0, polls, weak_hook
from ddp_lab.sync.every_step.averaging import AveragingOptions, AveragingSync
from ddp_lab.telemetry import position
from ddp_lab.tuning import wait_polling


@dataclass
class FlatOptions(AveragingOptions):
    buffer_mb: float = key(25.0, "the gradients in flat buffers of at most this many MB (DDP's bucket), the "
                                 "model's last parameters in the first (0: one buffer for all)", at_least=0)
    overlap_backward: bool = key(True, "sync.algo=builtin: each buffer all-reduced as soon as the backward has "
                                       "filled it, while the rest of the backward runs (false, or a hand-written "
                                       "sync.algo: every buffer after the backward)")


class FlatSync(AveragingSync):
    """One all-reduce per flat buffer holding every gradient: started in the backward as each buffer fills
    (sync.overlap_backward, algo builtin), else after it.

    Each param's .grad is a view into a persistent buffer, so backward writes
    (and accumulates, with grad_accum) straight into it: no copy on the way
    in or out. caps.grads_set_to_none is False so the trainer zeroes the views in
    place; a set_to_none=True anyway only costs one copy at the next sync.
    """

    comm_timing = "after_backward"  # (overlapped: the wait after the backward, what the step still pays)
    caps = Capabilities(grads_set_to_none=False)
    name = "flat"

    def __init__(self, model: nn.Module, env: DistEnv, cfg: FlatOptions, ctx: SyncContext = NO_CONTEXT,
                 gradients: bool = True, buffer_mb: float | None = None, overlap: bool | None = None):
        super().__init__(model, env, cfg)
        # (local_sgd's synchronous steps: one buffer, after the backward)
        buffer_mb = cfg.buffer_mb if buffer_mb is None else buffer_mb
        overlap = cfg.overlap_backward if overlap is None else overlap
        # (gradients=False: another strategy averages them, sync.islands' inner one, which has broadcast the
        # weights (their storage, sharded inside, may be freed by now); no buffers then)
        if gradients:
            broadcast_from_rank0(model)
        params = [p for p in model.parameters() if p.requires_grad]
        # the last parameters first: the backward computes their gradients first
        self.buckets = [Bucket(ps) for ps in bucketed(params[::-1], buffer_mb * 2**20)] if gradients else []
        for b in self.buckets:
            b.attach()  # start with zero views, so the first backward accumulates into them
        # one buffer is filled only when the backward ends: nothing to overlap
        self.overlapped = overlap and cfg.algo == "builtin" and len(self.buckets) > 1
        self._accumulating = False  # in no_sync(): a micro-batch before the step's last
        self._in_flight: list[tuple[Bucket, torch.Tensor, object]] = []  # (bucket, what travels, its work)
        if self.overlapped:
            for k, b in enumerate(self.buckets):
                for i, p in enumerate(b.params):
                    p.register_post_accumulate_grad_hook(weak_hook(self._grad_in, k, i))

    def _grad_in(self, k: int, i: int, p: torch.Tensor) -> None:
        """Parameter i of buffer k has its gradient: the buffer's all-reduce starts once that fills it."""
        if not self._accumulating and self.buckets[k].mark_ready(i):
            self._start(self.buckets[k])

    def _start(self, bucket: Bucket) -> None:
        """bucket's all-reduce (a sum: divided by the ranks when it lands) on its way, not waited for."""
        bucket.attach()
        bucket.launched = True
        wire = bucket.buffer
        if self.wire_dtype is not None and wire.dtype != self.wire_dtype:
            wire = wire.to(self.wire_dtype).div_(self.env.world_size)  # (divided first: an fp16 sum cannot overflow)
        self.count(wire.numel() * wire.element_size())
        self._in_flight.append((bucket, wire, dist.all_reduce(wire, group=self.env.group, async_op=True)))

    def no_sync(self):
        return self._accumulating_grads() if self.overlapped else super().no_sync()

    @contextlib.contextmanager
    def _accumulating_grads(self):
        self._accumulating = True
        try:
            yield
        finally:
            self._accumulating = False

    def after_backward(self) -> None:
        with position.collective("gradient sync"), self._timed():
            if not self.overlapped:
                for b in self.buckets:
                    b.attach()
                    self._average(b.buffer)
                return
            for b in self.buckets:  # a parameter the step did not use left its buffer unfilled
                if not b.launched:
                    self._start(b)
            for bucket, wire, work in self._in_flight:
                if polls(self.cfg, self.env):
                    wait_polling(work.is_completed)
                work.wait()
                if wire is bucket.buffer:
                    wire.div_(self.env.world_size)
                else:
                    bucket.buffer.copy_(wire)
                bucket.reset()
            self._in_flight.clear()


class Bucket:
    """A flat gradient buffer and, for each of its params, the view that is its .grad."""

    def __init__(self, params: list[nn.Parameter]):
        p0 = params[0]
        self.params = params
        self.ready = [False] * len(params)  # (overlapped: which gradients of this step are in)
        self.filled, self.launched = 0, False
        self.buffer = torch.zeros(sum(p.numel() for p in params), dtype=p0.dtype, device=p0.device)
        self.views = []
        offset = 0
        for p in params:
            strides = dense_strides(p)  # the param's own layout (e.g. channels_last)
            if strides is None:
                view = self.buffer[offset:offset + p.numel()].view(p.shape)
            else:
                view = self.buffer.as_strided(p.shape, strides, offset)
            self.views.append(view)
            offset += p.numel()

    def mark_ready(self, i: int) -> bool:
        """Param i's gradient of this step is in; True when that fills the buffer. A gradient coming in twice
        (a parameter used in two backward passes of one step) after its buffer left is an error, not a sum."""
        if self.launched:
            raise RuntimeError("sync.overlap_backward: a gradient arrived after its buffer's all-reduce had started "
                               "(a parameter used by two backward passes of one step, e.g. reentrant activation "
                               "checkpointing): set sync.overlap_backward=false")
        if not self.ready[i]:
            self.ready[i] = True
            self.filled += 1
        self.launched = self.filled == len(self.params)
        return self.launched

    def reset(self) -> None:
        self.ready = [False] * len(self.params)
        self.filled, self.launched = 0, False

    def attach(self) -> None:
        """Make every param's .grad its view again, keeping any gradient already there.

        After zero_grad(set_to_none=True), backward allocates fresh .grad
        tensors: they are copied in once and replaced by the views.
        """
        for p, view in zip(self.params, self.views):
            g = p.grad
            if g is None:
                view.zero_()  # unused this step: counts as a zero gradient on this rank
            elif g.data_ptr() == view.data_ptr() and g.stride() == view.stride():
                continue
            else:
                view.copy_(g)
            p.grad = view


def bucketed(params: list[nn.Parameter], cap_bytes: float) -> list[list[nn.Parameter]]:
    """Consecutive params of one dtype and device, up to cap_bytes each (0: no cap)."""
    buckets: list[list[nn.Parameter]] = []
    size = 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        last = buckets[-1] if buckets else None
        if (last is None or (last[0].dtype, last[0].device) != (p.dtype, p.device)
                or (cap_bytes > 0 and size + nbytes > cap_bytes)):
            buckets.append([p])
            size = nbytes
        else:
            last.append(p)
            size += nbytes
    return buckets


def dense_strides(t: torch.Tensor) -> tuple[int, ...] | None:
    """t's strides if its elements fill numel() consecutive slots (contiguous,
    channels_last, any permutation), else None."""
    expected = 1
    for d in sorted(range(t.dim()), key=lambda d: t.stride(d)):
        if t.size(d) != 1:
            if t.stride(d) != expected:
                return None
            expected *= t.size(d)
    return t.stride()


def flat_view(t: torch.Tensor) -> torch.Tensor | None:
    """A 1-D view of all of t's elements in memory order, or None if they are not dense."""
    if t.is_contiguous():
        return t.view(-1)
    if dense_strides(t) is None:
        return None
    return t.as_strided((t.numel(),), (1,), t.storage_offset())
