"""sync=zero sync.zero_stage=2: the gradients sharded too, reduce-scattered during the backward.

Stage 1 (zero1.py, the layout and schedule this file keeps) holds every rank's whole gradient.
Stage 2 keeps 1/N of it: with AdamW in fp32 a rank holds at the optimizer step 4 bytes of weights
per parameter and 12/N of gradients and moments, 4 + 12/N instead of stage 1's 8 + 8/N.

What changes: when a bucket's gradients are all there, they are copied into a bucket-sized buffer
and dropped (p.grad = None); the mean of this rank's chunk, when its reduce-scatter lands, is its
chunk's gradient (added to it, under accumulation). A chunk's gradient is made there and dropped
after the optimizer step (zero_grad sets it to None), as FSDP2 does: between steps a rank holds no
gradient, and in the backward only those of the buckets landed so far, while the activations
still held shrink. (Kept whole between steps, they were what held stage 3's peak above fsdp's:
measured in docs/memory.md, stage 3's peak.) Under trainer.grad_accum every micro-batch is
reduce-scattered (the gradients never exist whole between micro-batches): k times the gradient
bytes of one step, as DeepSpeed's stage 2.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from ddp_lab.collectives.basics import Pending
from ddp_lab.sync.sharded.common import views_into
from ddp_lab.sync.sharded.zero1 import Zero1Sync
from ddp_lab.telemetry import position


class Zero2Sync(Zero1Sync):
    caps = replace(Zero1Sync.caps, sharding=2, grads_set_to_none=True)  # (made as each bucket lands)
    reduce_dtype: torch.dtype | None = None  # the gradients' dtype on the wire (None: the pieces'; stage 3 sets it)

    def _attach_grads(self) -> None:
        """None: a chunk's gradient is made as its bucket lands (_land), the parameters' own dropped once sent."""
        self.accumulating = False  # (never: every micro-batch sends)

    def no_sync(self):
        return position.collective("gradient sync")  # every micro-batch reduce-scatters (see above)

    def _bucket_grads(self, i: int) -> torch.Tensor:
        """Bucket i's gradients in one buffer of N chunks, copied out of the parameters, which drop them."""
        like = self.pieces[i]  # (stage 3 with bf16 weights: in sync.reduce_dtype)
        flat = torch.zeros(self.chunks[i] * self.env.world_size, dtype=self.reduce_dtype or like.dtype,
                           device=like.device)
        for p, g in zip(self.buckets[i], views_into(flat, self.buckets[i])):
            if p.grad is not None:  # (none: unused this backward, its zeros stand for it)
                g.copy_(p.grad)
                p.grad = None
        return flat

    def _land(self, pending: Pending, i: int, flat: torch.Tensor) -> None:
        """Wait for bucket i's reduce-scatter; its mean is this rank's chunk's gradient (added to it under
        accumulation)."""
        mean, piece = pending.wait().div_(self.env.world_size), self.pieces[i]
        if piece.grad is not None:
            piece.grad.add_(mean)
        elif mean.dtype != piece.dtype or mean._base is not None:  # bf16 on the wire; a view keeps `flat`
            piece.grad = mean.to(piece.dtype, copy=True)
        else:  # (builtin's output: a chunk of its own)
            piece.grad = mean
