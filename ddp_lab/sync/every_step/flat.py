"""sync=flat: every gradient a view into persistent flat buffers, one allreduce per buffer."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ddp_lab.config.keys import key
from ddp_lab.distributed import DistEnv
from ddp_lab.sync.base import NO_CONTEXT, Capabilities, SyncContext, broadcast_from_rank0
from ddp_lab.sync.every_step.averaging import AveragingOptions, AveragingSync
from ddp_lab.telemetry import position


@dataclass
class FlatOptions(AveragingOptions):
    buffer_mb: float = key(0.0, "the gradients in flat buffers of at most this many MB, one all-reduce each after "
                                "the backward (0: one buffer for all)", at_least=0)


class FlatSync(AveragingSync):
    """After backward, one allreduce per flat buffer holding every gradient.

    Each param's .grad is a view into a persistent buffer, so backward writes
    (and accumulates, with grad_accum) straight into it: no copy on the way
    in or out. caps.grads_set_to_none is False so the trainer zeroes the views in
    place; a set_to_none=True anyway only costs one copy at the next sync.
    """

    comm_timing = "after_backward"
    caps = Capabilities(grads_set_to_none=False)
    name = "flat"

    def __init__(self, model: nn.Module, env: DistEnv, cfg: FlatOptions, ctx: SyncContext = NO_CONTEXT,
                 gradients: bool = True, buffer_mb: float | None = None):
        super().__init__(model, env, cfg)
        buffer_mb = cfg.buffer_mb if buffer_mb is None else buffer_mb  # (local_sgd's synchronous steps: its own)
        # (gradients=False: another strategy averages them, sync.islands' inner one, which has broadcast the
        # weights (their storage, sharded inside, may be freed by now); no buffers then)
        if gradients:
            broadcast_from_rank0(model)
        params = [p for p in model.parameters() if p.requires_grad]
        self.buckets = [Bucket(ps) for ps in bucketed(params, buffer_mb * 2**20)] if gradients else []
        for b in self.buckets:
            b.attach()  # start with zero views, so the first backward accumulates into them

    def after_backward(self) -> None:
        with position.collective("gradient sync"), self._timed():
            for b in self.buckets:
                b.attach()
                self._average(b.buffer)


class Bucket:
    """A flat gradient buffer and, for each of its params, the view that is its .grad."""

    def __init__(self, params: list[nn.Parameter]):
        p0 = params[0]
        self.params = params
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
