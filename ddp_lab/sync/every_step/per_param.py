"""sync=per_param: one allreduce per parameter after backward, as in d2l's chapter."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ddp_lab.distributed import DistEnv
from ddp_lab.sync.base import NO_CONTEXT, SyncContext, broadcast_from_rank0
from ddp_lab.sync.every_step.averaging import AveragingOptions, AveragingSync
from ddp_lab.sync.every_step.flat import flat_view
from ddp_lab.telemetry import position


@dataclass
class PerParamOptions(AveragingOptions):
    """per_param's keys are the every-step strategies' own."""


class PerParamSync(AveragingSync):
    """After backward, one allreduce per parameter gradient: many small messages,
    each paying the latency, where flat sends one."""

    comm_timing = "after_backward"
    name = "per_param"

    def __init__(self, model: nn.Module, env: DistEnv, cfg: PerParamOptions, ctx: SyncContext = NO_CONTEXT):
        super().__init__(model, env, cfg)
        broadcast_from_rank0(model)
        self.params = [p for p in model.parameters() if p.requires_grad]

    def after_backward(self) -> None:
        with position.collective("gradient sync"), self._timed():
            for p in self.params:
                if p.grad is None:  # unused this step: a zero gradient on this rank
                    p.grad = torch.zeros_like(p)
                flat = flat_view(p.grad)
                if flat is not None:
                    self._average(flat)
                else:
                    tmp = p.grad.contiguous().view(-1)
                    self._average(tmp)
                    p.grad.copy_(tmp.view(p.grad.shape))
