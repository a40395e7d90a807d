"""A strategy written outside ddp_lab, all in this file: its options, its class, its one registry entry.

What a user adding a strategy writes; tests/sync/test_registry.py trains with it (`sync=toy`)."""
from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from ddp_lab.config.keys import key, positive_finite
from ddp_lab.sync import ReplicaSync, register
from ddp_lab.sync.base import NO_CONTEXT, SyncContext, broadcast_from_rank0
from ddp_lab.sync.options import SyncOptions


@dataclass
class ToyOptions(SyncOptions):
    scale: float = key(1.0, "the summed gradients times scale / ranks (1: the mean)", ok=positive_finite,
                       rule="a positive number")


class ToySync(ReplicaSync):
    """One all-reduce per gradient after the backward, scaled."""

    comm_timing = "after_backward"

    def __init__(self, model, env, cfg: ToyOptions, ctx: SyncContext = NO_CONTEXT):
        super().__init__(model, env)
        self.cfg = cfg
        broadcast_from_rank0(model, env.group)
        self.params = [p for p in model.parameters() if p.requires_grad]

    def after_backward(self) -> None:
        for p in self.params:
            dist.all_reduce(p.grad, group=self.env.group)
            p.grad.mul_(self.cfg.scale / self.env.world_size)
            self.count(p.grad.numel() * p.grad.element_size())

    def describe(self) -> str:
        return f"toy(scale {self.cfg.scale:g})"


register("toy", ToyOptions, ToySync)
