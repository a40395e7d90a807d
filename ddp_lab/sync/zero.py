"""sync.mode=zero: ZeRO stage 1, each rank keeps the optimizer state of its own shard only.

ZeRO (Rajbhandari et al. 2019) splits what every DDP rank holds N ways. Stage 1 shards the
optimizer state: with AdamW in fp32 a rank holds 4 bytes of weights, 4 of gradients and
8/N of moments per parameter, 8 + 8/N instead of DDP's 16, for the same bytes on the wire.

A step, on one flat buffer of every weight (padded to N equal shards, each parameter a view
into it, so the model computes as before):

1. backward writes each gradient into a flat gradient buffer laid out the same way;
2. reduce-scatter: rank r ends with the sum of shard r of every rank's gradients, / N;
3. the optimizer steps shard r alone (a parameter that is a view of shard r of the weights,
   so the model's own parameters change with it): its state is 1/N of DDP's;
4. all-gather: every rank's shard of the new weights reaches every other rank (after_step).

2 and 4 together are one ring all-reduce's traffic, split around the optimizer step.
sync.algo=builtin runs torch's reduce_scatter_tensor and all_gather_into_tensor (gloo sums,
then this divides: its ReduceOp.AVG is wrong, pytorch#162338); ring_textbook runs ours.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ddp_lab.collectives import (
    TORCH_ALL_GATHER,
    TORCH_REDUCE_SCATTER,
    ring_textbook_all_gather,
    ring_textbook_reduce_scatter,
)
from ddp_lab.config import ConfigError
from ddp_lab.distributed import DistEnv
from ddp_lab.sync.base import ReplicaSync, broadcast_from_rank0
from ddp_lab.sync.flat import dense_strides
from ddp_lab.telemetry import position

ALGOS = ("builtin", "ring_textbook")  # those with a reduce-scatter and an all-gather of their own


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


class ZeroSync(ReplicaSync):
    comm_timing = "after_backward"
    grads_set_to_none = False  # the gradients are views into the flat buffer
    shards = True  # each rank's optimizer state is its own: checkpointed by every rank

    def __init__(self, model: nn.Module, env: DistEnv, cfg):
        super().__init__(model, env)
        self.cfg = cfg
        params = trainable_parameters(model, "sync.mode=zero")
        broadcast_from_rank0(model)
        n, r = env.world_size, env.rank
        total = sum(p.numel() for p in params)
        self.shard_size = -(-total // n)  # ceil: the last shard padded with zeros
        dtype, device = params[0].dtype, params[0].device
        self.weights = torch.zeros(self.shard_size * n, dtype=dtype, device=device)
        self.grads = torch.zeros_like(self.weights)
        self.params, self.grad_views = params, views_into(self.grads, params)
        with torch.no_grad():
            for p, w, g in zip(params, views_into(self.weights, params), self.grad_views):
                w.copy_(p)
                p.data = w  # the model's weights now live in the flat buffer
                p.grad = g  # and backward accumulates into the flat gradient buffer
        mine = slice(r * self.shard_size, (r + 1) * self.shard_size)
        self.shard = nn.Parameter(self.weights[mine])  # shares the buffer: the optimizer's only parameter
        self.shard.grad = self.grads[mine]  # where the reduce-scatter leaves this rank's sum
        self._out = torch.empty_like(self.shard.grad)  # builtin: collectives write no input of theirs

    def parameters(self):
        return [self.shard]

    def group_sizes(self) -> list[int]:
        """The unpadded elements of what each of this rank's parameters is a chunk of (checkpoint/reshard.py)."""
        return [sum(p.numel() for p in self.params)]

    def after_backward(self) -> None:
        """Reduce-scatter the gradients: shard r's mean over the ranks lands in self.shard.grad."""
        self._reattach()
        with position.collective("gradient sync"), self._timed():
            if self.cfg.algo == "builtin":
                TORCH_REDUCE_SCATTER(self._out, self.grads, op=dist.ReduceOp.SUM)
                self.shard.grad.copy_(self._out)
            else:  # in place: this rank's shard of the buffer ends with the sum
                ring_textbook_reduce_scatter(self.grads)
            self.shard.grad.div_(self.env.world_size)
        # counted once a step, here: this reduce-scatter and the all-gather after the step
        # move what one all-reduce of the buffer moves (wire_bytes: bytes handed to all-reduces)
        self.wire_bytes += self.grads.numel() * self.grads.element_size()

    def after_step(self, step: int) -> None:
        """All-gather the new weights (each rank stepped its own shard); clear the gradients."""
        with position.collective("weight sync"), self._timed(), torch.no_grad():
            if self.cfg.algo == "builtin":
                TORCH_ALL_GATHER(self.weights, self._out.copy_(self.shard.detach()))
            else:
                ring_textbook_all_gather(self.weights)
        self.grads.zero_()

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        return clip_sharded([self.shard.grad], max_norm)

    def _reattach(self) -> None:
        """A .grad that is not its view (set to None, or replaced) goes back into the buffer."""
        for p, g in zip(self.params, self.grad_views):
            if p.grad is None:
                continue  # unused this step: its zeros in the buffer stand for it
            if p.grad.data_ptr() != g.data_ptr():
                g.copy_(p.grad)
                p.grad = g

    def describe(self) -> str:
        return f"zero{self.cfg.zero_stage}/{self.cfg.algo}"
