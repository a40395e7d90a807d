"""What the sharded family shares (ZeRO stages 1-3 in zero1.py, zero2.py, zero3.py, and torch's FSDP2 in
fsdp.py): the collectives they run on, parameters as views into one flat buffer, gradient clipping over
shards. (The units stage 3 and fsdp gather: units.py; their freed gathers given back:
distributed/host_malloc.py.)"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ddp_lab.config import ConfigError
from ddp_lab.config.keys import key
from ddp_lab.sync.every_step.flat import dense_strides
from ddp_lab.sync.options import SyncOptions
from ddp_lab.telemetry import position

ALGOS = ("builtin", "ring_textbook", "direct")  # those with a reduce-scatter and an all-gather of their own
REDUCE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # sync.reduce_dtype (stage 3, fsdp under bf16)


@dataclass
class ShardedOptions(SyncOptions):
    """The keys of the strategies that shard the weights (zero stage 3, fsdp): the dtypes they gather and reduce in."""

    param_dtype: str = key("amp", "the dtype the weights are gathered in (stage 3, fsdp): amp (bf16 under "
                                  "trainer.amp=bf16, the optimizer stepping fp32 shards; else as they are) | fp32 "
                                  "(as they are, autocast casting them op by op)",
                           ok=lambda v: v in ("amp", "fp32"), rule="amp or fp32")
    reduce_dtype: str = key("fp32", "under trainer.amp=bf16 with the weights gathered in bf16: the dtype gradients "
                                    "are reduce-scattered in: fp32 | bf16", ok=lambda v: v in REDUCE_DTYPES,
                            rule="fp32 or bf16")


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
                          f"and device; this model has {sorted(str(d) for d, _ in kinds)}: use sync=flat")
    return params


NORM_BLOCK = 2**20  # elements of a gradient squared at a time by clip_sharded


def clip_sharded(grads: list[torch.Tensor], max_norm: float, group=None) -> torch.Tensor:
    """The norm over every rank's shard of the gradients (one all-reduce of a number over the ranks that
    hold the shards, `group`), then each rank scales its own `grads` in place; returns the norm before."""
    # in float64, a block at a time: a whole shard cast to float64 and squared would hold 4x its bytes
    squares = sum(b.double().pow(2).sum() for g in grads for b in g.reshape(-1).split(NORM_BLOCK)).reshape(1)
    with position.collective("gradient norm"):
        dist.all_reduce(squares, group=group)
    norm = squares.sqrt().squeeze().to(grads[0].dtype)
    for g in grads:
        g.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))  # as torch's clip_grad_norm_
    return norm


def state_names(model: nn.Module) -> dict[int, list[str]]:
    """id(tensor) -> its names in the model's state_dict (a tied weight has two)."""
    names: dict[int, list[str]] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        names.setdefault(id(t), []).append(name)
    return names


def load_whole_part(model: nn.Module, whole: dict) -> None:
    """Copy the state every rank holds whole (buffers, frozen parameters) back into the model."""
    state = model.state_dict(keep_vars=True)
    missing = sorted(set(whole) - set(state))
    if missing:
        raise ValueError(f"the model has no {', '.join(missing[:3])}")
    with torch.no_grad():
        for name, value in whole.items():
            state[name].copy_(value)
