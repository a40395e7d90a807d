"""What the ZeRO stages (zero.py, zero2.py, zero3.py) and fsdp.py share: the collectives they
run on, parameters as views into one flat buffer, and gradient clipping over shards."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ddp_lab.config import ConfigError
from ddp_lab.sync.flat import dense_strides
from ddp_lab.telemetry import position

ALGOS = ("builtin", "ring_textbook", "direct")  # those with a reduce-scatter and an all-gather of their own


def views_into(buffer: torch.Tensor, params: list[nn.Parameter]) -> list[torch.Tensor]:
    """For each parameter, a view of `buffer` with its shape and layout, one after another."""
    views, offset = [], 0
    for p in params:
        strides = dense_strides(p)  # the parameter's own layout (e.g. channels_last)
        views.append(buffer[offset:offset + p.numel()].view(p.shape) if strides is None
                     else buffer.as_strided(p.shape, strides, buffer.storage_offset() + offset))  # (absolute)
        offset += p.numel()
    return views


def trainable_parameters(model: nn.Module, what: str) -> list[nn.Parameter]:
    """The parameters that train, refused unless all of one floating-point dtype and device (one flat buffer)."""
    params = [p for p in model.parameters() if p.requires_grad]
    kinds = {(p.dtype, p.device) for p in params}
    if len(kinds) != 1 or not next(iter(kinds))[0].is_floating_point:
        raise ConfigError(f"{what} needs every trainable parameter of one floating-point dtype "
                          f"and device; this model has {sorted(str(d) for d, _ in kinds)}: use sync.mode=flat")
    return params


def clip_sharded(grads: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """The norm over every rank's shard of the gradients (one all-reduce of a number), then each rank
    scales its own `grads` in place; returns the norm before."""
    squares = sum(g.double().pow(2).sum() for g in grads).reshape(1)
    with position.collective("gradient norm"):
        dist.all_reduce(squares)
    norm = squares.sqrt().squeeze().to(grads[0].dtype)
    for g in grads:
        g.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))  # as torch's clip_grad_norm_
    return norm
