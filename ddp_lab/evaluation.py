"""Exact test accuracy across ranks.

Each rank scores its own disjoint shard of the test set (ddp_lab.data's
eval_indices: no sampler padding, every image counted once) and the counts
are summed, so accuracy at 3 ranks equals accuracy at 1.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

from ddp_lab.distributed import DistEnv, all_reduce_sum
from ddp_lab.guards import stall


@torch.no_grad()
def evaluate(model: nn.Module, loader, env: DistEnv,
             autocast=contextlib.nullcontext) -> tuple[int, int]:
    """(correct, total) over the whole test set, the same on every rank."""
    if env.distributed:  # BatchNorm statistics drift apart per rank: use rank 0's
        with stall.collective("evaluation buffers"):
            for b in model.buffers():
                dist.broadcast(b, src=0)
    was_training = model.training
    model.eval()
    counts = torch.zeros(2, dtype=torch.int64, device=env.device)
    stall.phase("evaluation")
    for x, y in loader.epoch(0):
        stall.progress()
        with autocast():
            out = model(x)
        counts[0] += (out.argmax(1) == y).sum()
        counts[1] += len(y)
    with stall.collective("evaluation counts"):
        all_reduce_sum(counts, env)
    model.train(was_training)
    correct, total = counts.tolist()
    return correct, total
