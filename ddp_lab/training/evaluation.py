"""Exact held-out figures across ranks.

Each rank scores its own disjoint shard of the held-out set (ddp_lab.training.data's
eval_indices: no sampler padding, every sample counted once) and the sums
(loss x targets, correct, targets) are added up, so accuracy and loss at 3
ranks equal those at 1.

A long evaluation (a large model's held-out set under zero stage 3) says how far it is:
rank 0 logs a line every PROGRESS_EVERY_S once it has run PROGRESS_FIRST_S (EvalProgress).
"""
from __future__ import annotations

import contextlib
import logging
import time

import torch
import torch.distributed as dist
from torch import nn

from ddp_lab.distributed import DistEnv, all_reduce_sum
from ddp_lab.models.calling import call, one_batch
from ddp_lab.telemetry import position
from ddp_lab.training.tasks import CLASSIFICATION, Task

log = logging.getLogger("ddp_lab")

PROGRESS_FIRST_S = 5.0  # an evaluation shorter than this says nothing
PROGRESS_EVERY_S = 10.0  # then one line every this long
clock = time.monotonic  # (a fake one in tests)


class EvalProgress:
    """Rank 0's progress through its share of the held-out set, one line per PROGRESS_EVERY_S
    once PROGRESS_FIRST_S have passed, through the `ddp_lab` logger (one plain line each, as
    a log file or a non-TTY console keeps it):

        evaluating: 1,234 of 5,678 batches (22%), 31 s

    Each batch costs one clock read and a comparison: no device sync, no collective, so a
    short evaluation costs nothing measurable and the other ranks are not waited for."""

    def __init__(self, total: int | None, on: bool = True):
        self.total, self.on = total, on
        self.start = clock()
        self.due = self.start + PROGRESS_FIRST_S
        self.done = 0

    def batch(self) -> None:
        """One more batch scored."""
        self.done += 1
        if not self.on:
            return
        now = clock()
        if now < self.due:
            return
        while self.due <= now:  # on the grid first + k * every, a tick a slow batch missed skipped
            self.due += PROGRESS_EVERY_S
        if self.total:
            log.info("evaluating: %s of %s batches (%.0f%%), %.0f s", f"{self.done:,}", f"{self.total:,}",
                     100 * self.done / self.total, now - self.start)
        else:
            log.info("evaluating: %s batch%s, %.0f s", f"{self.done:,}", "" if self.done == 1 else "es",
                     now - self.start)


def _batches(loader) -> int | None:
    try:
        return len(loader)
    except TypeError:  # a loader without a length: the lines count batches alone
        return None


@torch.no_grad()
def evaluate(model: nn.Module, loader, env: DistEnv, task: Task = CLASSIFICATION,
             autocast=contextlib.nullcontext, lockstep: torch.Tensor | dict | None = None) -> tuple[float, int, int]:
    """(loss sum, correct, targets) over the whole held-out set, the same on every rank.
    lockstep: one sample's input, where every forward is a collective (zero stage 3, fsdp gather the
    weights in it): a rank with fewer batches than another runs it, uncounted, until they are even.
    Rank 0 logs its progress where the evaluation runs long (EvalProgress)."""
    progress = EvalProgress(None, on=env.is_main)
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
    mine = _batches(loader)
    progress.total = None if mine is None else mine + extra
    for x, y in loader.epoch(0):
        position.progress()
        with autocast():
            out = call(model, x)
        task.accumulate(sums, task.loss(out, y), out, y)
        progress.batch()
    for _ in range(extra):
        with autocast():
            call(model, one_batch(lockstep, env.device))
        progress.batch()
    with position.collective("evaluation counts"):
        all_reduce_sum(sums, env)
    model.train(was_training)
    loss_sum, correct, total = sums.tolist()
    return loss_sum, int(correct), int(total)
