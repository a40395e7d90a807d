"""Stop a diverging run before it writes NaN weights anywhere.

A learning rate that is far too high (or fp16 overflowing) turns the loss
into inf or NaN, and after one optimizer step every weight is NaN. Without
a check such a run finishes "fine" with test accuracy 0.10, and its NaN
checkpoints push the last good ones out. So every step is watched, and the
first non-finite one stops every rank at that step, with one line saying
which step, which ranks, what loss, and the likely cause.

Every rank must stop at the same step, or the others would wait for it in
the next collective until dist.timeout_s. No collective is needed for that:
a rank's non-finite loss makes its gradient non-finite, and after the
gradient sync every rank holds the same averaged gradient, so each rank
checks that gradient by itself (`grad_total`, or the norm clipping has just computed). On CPU the check is read
every step; on CUDA reading it would stall the GPU queue, so the first bad
step is kept on the device and read every `trainer.log_every` steps and
before anything is saved. Under fp16 a non-finite gradient is the loss
scaler's business (it skips the step), and under sync=local_sgd or
diloco the gradients are not synchronised, so there the ranks compare their
losses with one small all-reduce, at those same steps only (local_sgd,
diloco: every sync.every steps).
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ddp_lab.config import RunFailed
from ddp_lab.distributed import DistEnv
from ddp_lab.telemetry import position


def grad_total(params) -> torch.Tensor:
    """The sum of every gradient's absolute values: finite exactly when every gradient is
    (short of 3e38), and the same on every rank once the gradients are synchronised."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    return torch.stack(torch._foreach_norm(grads, 1)).sum()


class LossWatch:
    """Call observe() every step after the gradient sync, and check() where a stop must happen."""

    def __init__(self, env: DistEnv, every: int, lr: float, amp: str, params=None):
        self.env, self.lr, self.amp = env, lr, amp
        # The synchronised gradients judge a step, but under fp16 (see the module
        # docstring) or without params, where the ranks compare their losses.
        self.params = None if amp == "fp16" or params is None else list(params)
        # (comparing the ranks' losses is an all-reduce: at those steps only, on CPU too)
        alone = self.params is not None or not env.distributed
        self.every = 1 if env.device.type == "cpu" and alone else max(1, every)
        # first step that was not finite (inf: none yet), and this rank's loss then
        self.first_bad = torch.full((1,), math.inf, dtype=torch.float64, device=env.device)
        self.bad_loss = torch.zeros(1, dtype=torch.float64, device=env.device)

    def observe(self, loss: torch.Tensor, step: int, grad_norm: torch.Tensor | None = None) -> None:
        """Note optimizer step `step` after its gradient sync: this rank's loss (a detached scalar) and, where
        clipping computed it, the synchronised gradients' norm. A finite norm on CPU spares the second pass
        over the gradients: every gradient is finite then (a non-finite norm may only be large ones' squares
        overflowing: grad_total judges it; on a GPU reading it would stall the queue)."""
        if self.params is None:
            judged = loss
        elif grad_norm is not None and grad_norm.device.type == "cpu" and math.isfinite(grad_norm):
            judged = grad_norm
        else:
            judged = grad_total(self.params)
        bad = ~torch.isfinite(judged.detach().double()).reshape(1) & torch.isinf(self.first_bad)
        self.first_bad = torch.where(bad, torch.full_like(self.first_bad, step), self.first_bad)
        self.bad_loss = torch.where(bad, loss.detach().double().reshape(1), self.bad_loss)
        if step % self.every == 0:
            self.check()

    def check(self) -> None:
        """Raise RunFailed on every rank if a step was not finite (on any rank, under fp16)."""
        first = self.first_bad.clone()
        if self.env.distributed and self.params is None:
            with position.collective("loss check"):
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
        losses = ", ".join(f"rank {r}: {loss}" for r, s, loss in ranks
                           if s == step and not math.isfinite(loss))
        what = f"the loss is not finite at step {step} ({losses})"
        if not losses:  # every loss finite, the gradients not
            what = (f"the gradients are not finite at step {step} (loss "
                    + ", ".join(f"rank {r}: {loss:.4g}" for r, _, loss in ranks) + ")")
        cause = (f"the learning rate optim.lr={self.lr:g} is likely too high: lower it, or "
                 f"warm up with optim.warmup_epochs")
        if self.amp == "fp16":
            cause += "; or fp16 overflowed: try trainer.amp=bf16 or off"
        return f"training diverged: {what}; {cause}. Nothing was saved from this step on"
