"""Stop a diverging run before it writes NaN weights anywhere.

A learning rate that is far too high (or fp16 overflowing) turns the loss
into inf or NaN, and after one optimizer step every weight is NaN. Without
a check such a run finishes "fine" with test accuracy 0.10, and its NaN
checkpoints push the last good ones out. So every step's loss is watched,
and the first non-finite one stops every rank at that step, with one line
saying which step, which ranks, what loss, and the likely cause.

Why every rank agrees first: the loss is each rank's own (its shard of the
batch), so one rank can see NaN while the others do not yet; if it stopped
alone, the others would wait for it in the next allreduce until
dist.timeout_s. `LossWatch.check` all-reduces the first bad step (MIN), so
all ranks stop together. On CPU that is one 8-byte allreduce per step (the
loss is already on the host); on CUDA reading the loss would stall the GPU
queue every step, so the first bad step is kept on the device and checked
every `trainer.log_every` steps and before anything is saved: the run then
stops a few steps late, but names the step it went bad.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ddp_lab import stall
from ddp_lab.config import ConfigError, RunFailed
from ddp_lab.distributed import DistEnv


def check_learning_rate(lr) -> None:
    """A NaN, infinite, zero or negative optim.lr is refused at start."""
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ConfigError(f"optim.lr={lr} must be a positive, finite number (e.g. optim.lr=0.1)")


class LossWatch:
    """Call observe(loss, step) every step and check() where a stop must happen."""

    def __init__(self, env: DistEnv, every: int, lr: float, amp: str):
        self.env, self.lr, self.amp = env, lr, amp
        self.every = 1 if env.device.type == "cpu" else max(1, every)
        # first step whose loss was not finite on this rank (inf: none yet), and that loss
        self.first_bad = torch.full((1,), math.inf, dtype=torch.float64, device=env.device)
        self.bad_loss = torch.zeros(1, dtype=torch.float64, device=env.device)

    def observe(self, loss: torch.Tensor, step: int) -> None:
        """Note this rank's loss of optimizer step `step` (a detached scalar)."""
        bad = ~torch.isfinite(loss.detach().double()).reshape(1) & torch.isinf(self.first_bad)
        self.first_bad = torch.where(bad, torch.full_like(self.first_bad, step), self.first_bad)
        self.bad_loss = torch.where(bad, loss.detach().double().reshape(1), self.bad_loss)
        if step % self.every == 0:
            self.check()

    def check(self) -> None:
        """Raise RunFailed on every rank if any rank has seen a non-finite loss."""
        first = self.first_bad.clone()
        if self.env.distributed:
            with stall.collective("loss check"):
                dist.all_reduce(first, op=dist.ReduceOp.MIN)
        step = first.item()
        if math.isinf(step):
            return
        raise RunFailed(self._message(int(step)))

    def _message(self, step: int) -> str:
        mine = (self.env.rank, self.first_bad.item(), self.bad_loss.item())
        ranks = [mine]
        if self.env.distributed:
            ranks = [None] * self.env.world_size
            dist.all_gather_object(ranks, mine)
        losses = ", ".join(f"rank {r}: {loss}" for r, s, loss in ranks if s == step)
        cause = (f"the learning rate optim.lr={self.lr:g} is likely too high: lower it, or "
                 f"warm up with optim.warmup_epochs")
        if self.amp == "fp16":
            cause += "; or fp16 overflowed: try trainer.amp=bf16 or off"
        return (f"training diverged: the loss is not finite at step {step} ({losses}); "
                f"{cause}. Nothing was saved from this step on")


def all_finite(state: dict) -> bool:
    """Whether every floating-point tensor in a state dict is finite."""
    return all(torch.isfinite(t).all() for t in state.values()
               if isinstance(t, torch.Tensor) and t.is_floating_point())
