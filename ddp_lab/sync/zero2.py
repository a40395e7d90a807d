"""sync.mode=zero sync.zero_stage=2: the gradients sharded too, reduce-scattered during the backward.

Stage 1 (zero.py) keeps every rank's whole gradient until the backward ends. Stage 2 keeps
1/N of it between steps: with AdamW in fp32 a rank holds 4 bytes of weights per parameter
and 12/N of gradients and moments, 4 + 12/N instead of stage 1's 8 + 8/N.

The parameters go into buckets of at most sync.bucket_cap_mb, in the reverse of the model's
order (roughly the order the backward finishes them, as DDP's buckets). Each bucket is a
slice of one flat weight buffer, padded to N equal chunks; rank r steps chunk r of every
bucket (one optimizer parameter per bucket, a view of the weights). In a backward:

1. a hook on each parameter counts the gradients autograd has finished; when a bucket's are
   all there, they are copied into a bucket-sized buffer and dropped (p.grad = None);
2. the buckets are reduce-scattered in bucket order (the same on every rank, whatever order
   they finish in): rank r adds the sum of its chunk, / N, to its chunk's gradient;
   sync.algo=builtin runs torch's asynchronously, at most two in flight, so they overlap
   the rest of the backward; ring_textbook runs ours, inside the hook;
3. at the end of the backward (a callback autograd runs) the buckets no hook completed
   (parameters without a gradient this time) are sent as zeros, and every one is waited for.

After the optimizer step each bucket's chunks are all-gathered into the weights (after_step).
Under trainer.grad_accum every micro-batch is reduce-scattered (the gradients never exist
whole between micro-batches): k times the gradient bytes of one step, as DeepSpeed's stage 2.
Communication time: the time inside the hooks and waiting at the end (comm_timing "hook").
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
from ddp_lab.distributed import DistEnv
from ddp_lab.sync.base import ReplicaSync, broadcast_from_rank0
from ddp_lab.sync.zero import clip_sharded, trainable_parameters, views_into
from ddp_lab.telemetry import position

IN_FLIGHT = 2  # builtin: reduce-scatters launched and not yet waited for (bounds their buffers)


def buckets_of(params: list[nn.Parameter], cap_bytes: float) -> list[list[nn.Parameter]]:
    """The parameters in reverse order, cut into buckets of at most cap_bytes (one parameter
    larger than that is a bucket of its own; cap 0: one bucket)."""
    out, size = [[]], 0
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if out[-1] and cap_bytes > 0 and size + nbytes > cap_bytes:
            out.append([])
            size = 0
        out[-1].append(p)
        size += nbytes
    return out


class Zero2Sync(ReplicaSync):
    comm_timing = "hook"
    grads_set_to_none = False  # each chunk's gradient is a view into one buffer
    shards = True
    syncs_in_backward = True

    def __init__(self, model: nn.Module, env: DistEnv, cfg):
        super().__init__(model, env)
        self.cfg = cfg
        params = trainable_parameters(model, "sync.mode=zero")
        broadcast_from_rank0(model)
        n, r = env.world_size, env.rank
        self.buckets = buckets_of(params, cfg.bucket_cap_mb * 2**20)
        self.chunks = [-(-sum(p.numel() for p in b) // n) for b in self.buckets]  # ceil: the last one padded
        starts = [0]
        for c in self.chunks:
            starts.append(starts[-1] + c * n)
        self.spans = [slice(a, b) for a, b in zip(starts, starts[1:])]  # each bucket's slice of the weights
        dtype, device = params[0].dtype, params[0].device
        self.weights = torch.zeros(starts[-1], dtype=dtype, device=device)
        self.grads = torch.zeros(sum(self.chunks), dtype=dtype, device=device)  # this rank's chunks only
        self.shard_size = sum(self.chunks)
        self.pieces, offset = [], 0  # this rank's chunk of each bucket: the optimizer's parameters
        with torch.no_grad():
            for bucket, span, c in zip(self.buckets, self.spans, self.chunks):
                for p, w in zip(bucket, views_into(self.weights[span], bucket)):
                    w.copy_(p)
                    p.data = w  # the model's weights now live in the flat buffer
                piece = nn.Parameter(self.weights[span][r * c:(r + 1) * c])
                piece.grad = self.grads[offset:offset + c]
                self.pieces.append(piece)
                offset += c
        self.bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        self.hooks = [p.register_post_accumulate_grad_hook(self._grad_ready) for p in params]
        self._start_backward()

    def parameters(self):
        return list(self.pieces)

    def group_sizes(self) -> list[int]:
        """The unpadded elements of each bucket (stage 3: unit), as parameters() lists their chunks."""
        return [sum(p.numel() for p in b) for b in self.buckets]

    def no_sync(self):
        return position.collective("gradient sync")  # every micro-batch reduce-scatters (see above)

    # ------------------------------------------------------------ in the backward
    def _start_backward(self) -> None:
        self.ready = [0] * len(self.buckets)  # gradients finished, per bucket
        self.next = 0  # the next bucket to send: they go in order
        self.in_flight: list[tuple] = []  # (work, bucket, output, input) of builtin's
        self.queued = False

    def _grad_ready(self, p: nn.Parameter) -> None:
        if not self.queued:  # the first gradient of a backward: its end flushes and waits
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
            self.queued = True
        self.ready[self.bucket_of[id(p)]] += 1
        while self.next < len(self.buckets) and self.ready[self.next] == len(self.buckets[self.next]):
            self._send(self.next)
            self.next += 1

    def _send(self, i: int) -> None:
        """Reduce-scatter bucket i's gradients; drop them from the parameters."""
        with self._timed():
            n, c = self.env.world_size, self.chunks[i]
            flat = torch.zeros(c * n, dtype=self.grads.dtype, device=self.grads.device)
            for p, g in zip(self.buckets[i], views_into(flat, self.buckets[i])):
                if p.grad is not None:  # (none: unused this backward, its zeros stand for it)
                    g.copy_(p.grad)
                    p.grad = None
            self.wire_bytes += flat.numel() * flat.element_size() // 2  # half an all-reduce's (as counted)
            if self.cfg.algo == "builtin":
                out = torch.empty(c, dtype=flat.dtype, device=flat.device)
                self.in_flight.append((TORCH_REDUCE_SCATTER(out, flat, op=dist.ReduceOp.SUM, async_op=True),
                                       i, out, flat))
                while len(self.in_flight) > IN_FLIGHT:
                    self._land(*self.in_flight.pop(0))
            else:  # ours, in place: chunk r of `flat` ends with the sum
                self._land(None, i, ring_textbook_reduce_scatter(flat), flat)

    def _land(self, work, i: int, out: torch.Tensor, flat: torch.Tensor) -> None:
        """Wait for bucket i's reduce-scatter; add its mean to this rank's chunk's gradient.
        (`flat` rides along in in_flight so that gloo can read it in the background until here.)"""
        if work is not None:
            work.wait()
        self.pieces[i].grad.add_(out.div_(self.env.world_size))

    def _end_backward(self) -> None:
        with position.collective("gradient sync"):
            while self.next < len(self.buckets):  # buckets with a parameter that got no gradient
                self._send(self.next)
                self.next += 1
            with self._timed():
                for args in self.in_flight:
                    self._land(*args)
        self._start_backward()

    # ------------------------------------------------------------ around the optimizer step
    def after_backward(self) -> None:
        """Nothing left: the backward's end waited for every bucket."""

    def after_step(self, step: int) -> None:
        """All-gather each bucket's new chunks (each rank stepped its own) into the weights."""
        self.wire_bytes += self.weights.numel() * self.weights.element_size() // 2  # the other half
        with position.collective("weight sync"), self._timed(), torch.no_grad():
            for piece, span in zip(self.pieces, self.spans):
                if self.cfg.algo == "builtin":
                    TORCH_ALL_GATHER(self.weights[span], piece.detach().clone())
                else:
                    ring_textbook_all_gather(self.weights[span])

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        return clip_sharded([self.grads], max_norm)  # this rank's chunks, one buffer

    def describe(self) -> str:
        return f"zero2/{self.cfg.algo}"
