"""Exact held-out figures across ranks.

Each rank scores its own disjoint shard of the held-out set (ddp_lab.training.data's
eval_indices: no sampler padding, every sample counted once) and the sums
(loss x targets, correct, targets) are added up, so accuracy and loss at 3
ranks equal those at 1.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

from ddp_lab.distributed import DistEnv, all_reduce_sum
from ddp_lab.telemetry import position
from ddp_lab.training.tasks import CLASSIFICATION, Task


@torch.no_grad()
def evaluate(model: nn.Module, loader, env: DistEnv, task: Task = CLASSIFICATION,
             autocast=contextlib.nullcontext, lockstep: torch.Tensor | None = None) -> tuple[float, int, int]:
    """(loss sum, correct, targets) over the whole held-out set, the same on every rank.
    lockstep: one sample's input, where every forward is a collective (zero stage 3, fsdp gather the
    weights in it): a rank with fewer batches than another runs it, uncounted, until they are even."""
    if env.distributed:  # BatchNorm statistics drift apart per rank: use rank 0's
        with position.collective("evaluation buffers"):
            for b in model.buffers():
                dist.broadcast(b, src=0)
    was_training = model.training
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=env.device)
    extra = 0  # uncounted forwards to run (lockstep)
    if lockstep is not None and env.distributed:  # (before any forward: those are collectives too)
        most = torch.tensor([len(loader)], device=env.device)
        with position.collective("evaluation batches"):
            dist.all_reduce(most, op=dist.ReduceOp.MAX)
        extra = int(most.item()) - len(loader)
    position.phase("evaluation")
    for x, y in loader.epoch(0):
        position.progress()
        with autocast():
            out = model(x)
        task.accumulate(sums, task.loss(out, y), out, y)
    for _ in range(extra):
        with autocast():
            model(lockstep.unsqueeze(0).to(env.device))
    with position.collective("evaluation counts"):
        all_reduce_sum(sums, env)
    model.train(was_training)
    loss_sum, correct, total = sums.tolist()
    return loss_sum, int(correct), int(total)
