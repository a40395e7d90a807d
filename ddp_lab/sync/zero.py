"""sync.mode=zero (sync.zero_stage=1): ZeRO stage 1, each rank keeps the optimizer state of its own shard only.

ZeRO (Rajbhandari et al. 2019) splits what every DDP rank holds N ways. Stage 1 shards the
optimizer state: with AdamW in fp32 a rank holds 4 bytes of weights, 4 of gradients and
8/N of moments per parameter, 8 + 8/N instead of DDP's 16, for the same bytes on the wire.

A step, on the layout of stage 2 (zero2.py: buckets of at most sync.bucket_cap_mb, each a
slice of one flat weight buffer padded to N chunks, every parameter a view into it, so the
model computes as before; rank r steps chunk r of every bucket):

1. backward accumulates each gradient into a whole gradient buffer laid out as the weights;
2. as soon as a bucket's gradients are all there (in the step's last micro-batch), it is
   reduce-scattered, during the rest of the backward as DDP's all-reduce is: rank r ends with
   the sum of chunk r of every rank's gradients, / N, which is what its optimizer steps;
3. the optimizer steps chunk r of each bucket alone (a view of the weights, so the model's own
   parameters change with it): its state is 1/N of DDP's;
4. all-gather: every rank's new chunks reach every other rank (after_step).

2 and 4 together are one all-reduce's traffic, split around the optimizer step. What stage 2
adds is dropping the gradients: stage 1 keeps them whole between micro-batches, so under
trainer.grad_accum it accumulates locally and sends once a step, where stage 2 sends every
micro-batch. sync.algo=builtin runs torch's reduce_scatter_tensor and all_gather_into_tensor (gloo
sums, then this divides: its ReduceOp.AVG is wrong, pytorch#162338); ring_textbook and direct
run ours (collectives/ring_textbook.py, collectives/direct.py).
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from ddp_lab.collectives.basics import Pending
from ddp_lab.distributed import DistEnv
from ddp_lab.sync.shards import clip_sharded, views_into
from ddp_lab.sync.zero2 import Zero2Sync


class ZeroSync(Zero2Sync):
    def __init__(self, model: nn.Module, env: DistEnv, cfg):
        super().__init__(model, env, cfg)
        r = env.rank
        self.whole_grads = torch.zeros_like(self.weights)
        self.grad_views = []  # per bucket, each parameter's view of the whole gradient buffer
        for bucket, span, c, piece in zip(self.buckets, self.spans, self.chunks, self.pieces):
            views = views_into(self.whole_grads[span], bucket)
            for p, g in zip(bucket, views):
                p.grad = g  # backward accumulates into the buffer
            self.grad_views.append(views)
            piece.grad = self.whole_grads[span][r * c:(r + 1) * c]  # where the mean of this rank's chunk lands
        self.grads = None  # (stage 2's buffer of this rank's chunks: here they are in the whole one)
        self.accumulating = False

    @contextlib.contextmanager
    def no_sync(self):
        """A micro-batch but the step's last: the gradients accumulate, nothing is sent."""
        self.accumulating = True
        try:
            yield
        finally:
            self.accumulating = False

    def _grad_ready(self, p: nn.Parameter) -> None:
        if not self.accumulating:
            super()._grad_ready(p)

    def _bucket_grads(self, i: int) -> torch.Tensor:
        """Bucket i's slice of the whole gradient buffer (a .grad replaced since goes back into it)."""
        for p, g in zip(self.buckets[i], self.grad_views[i]):
            if p.grad is None:
                p.grad = g  # (unused: its zeros stand for it)
            elif p.grad.data_ptr() != g.data_ptr():
                g.copy_(p.grad)
                p.grad = g
        return self.whole_grads[self.spans[i]]

    def _land(self, pending: Pending, i: int, flat: torch.Tensor) -> None:
        """This rank's chunk of bucket i <- its mean; the others' chunks zeroed (the next step's start)."""
        mean = pending.wait().div_(self.env.world_size)
        grad = self.pieces[i].grad
        if mean.data_ptr() != grad.data_ptr():  # builtin: it came in an output of its own
            grad.copy_(mean)
        r, c = self.env.rank, self.chunks[i]
        flat[:r * c].zero_()
        flat[(r + 1) * c:].zero_()

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        return clip_sharded([p.grad for p in self.pieces], max_norm)

    def describe(self) -> str:
        return f"zero1/{self.cfg.algo}"

