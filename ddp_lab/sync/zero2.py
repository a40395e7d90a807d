"""sync.mode=zero sync.zero_stage=2: the gradients sharded too, reduce-scattered during the backward.

Stage 1 (zero.py, on this file's layout and schedule) keeps every rank's whole gradient. Stage 2
keeps 1/N of it between steps: with AdamW in fp32 a rank holds 4 bytes of weights per parameter
and 12/N of gradients and moments, 4 + 12/N instead of stage 1's 8 + 8/N.

The parameters go into buckets of at most sync.bucket_cap_mb, in the reverse of the model's
order (roughly the order the backward finishes them, as DDP's buckets). Each bucket is a
slice of one flat weight buffer, padded to N equal chunks; rank r steps chunk r of every
bucket (one optimizer parameter per bucket, a view of the weights). In a backward:

1. a hook on each parameter counts the gradients autograd has finished; when a bucket's are
   all there, they are copied into a bucket-sized buffer and dropped (p.grad = None);
2. the buckets are reduce-scattered in bucket order (the same on every rank, whatever order
   they finish in): rank r adds the sum of its chunk, / N, to its chunk's gradient;
   sync.algo=builtin (torch's) and direct (ours, collectives/direct.py) run asynchronously,
   at most two in flight, so they overlap the rest of the backward; ring_textbook runs
   ours inside the hook;
3. at the end of the backward (a callback autograd runs) the buckets no hook completed
   (parameters without a gradient this time) are sent as zeros, and every one is waited for.

After the optimizer step each bucket's chunks are all-gathered into the weights (after_step).
Under sync.algo=direct every bucket's all-gather is posted at once, in the forward's order, and
the next forward waits for a bucket only in the pre-hook of a module that holds one of its
parameters: the weights travel while the forward computes (DDP's all-reduce has no such
second half to hide). Whatever reads the weights first waits for all (_wait_gathers).
Under trainer.grad_accum every micro-batch is reduce-scattered (the gradients never exist
whole between micro-batches): k times the gradient bytes of one step, as DeepSpeed's stage 2.
Communication time: the time inside the hooks and waiting at the end (comm_timing "hook").
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

from ddp_lab.collectives import (
    TORCH_ALL_GATHER,
    TORCH_REDUCE_SCATTER,
    direct_all_gather,
    direct_reduce_scatter,
    ring_textbook_all_gather,
    ring_textbook_reduce_scatter,
)
from ddp_lab.collectives.basics import Pending
from ddp_lab.distributed import DistEnv
from ddp_lab.sync.base import ReplicaSync, broadcast_from_rank0
from ddp_lab.sync.shards import clip_sharded, trainable_parameters, views_into
from ddp_lab.telemetry import position

IN_FLIGHT = 2  # builtin, direct: reduce-scatters launched and not yet waited for (bounds their buffers)


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
        self.gathering: dict[int, Pending] = {}  # direct: bucket -> its all-gather under way
        if cfg.algo == "direct":
            for m in model.modules():
                mine = sorted({self.bucket_of[id(p)] for p in m.parameters(recurse=False) if id(p) in self.bucket_of})
                if mine:
                    m.register_forward_pre_hook(lambda _m, _a, mine=mine: self._wait_gathers(mine))

    def parameters(self):
        return list(self.pieces)

    def group_sizes(self) -> list[int]:
        """The unpadded elements of each bucket (stage 3: unit), as parameters() lists their chunks."""
        return [sum(p.numel() for p in b) for b in self.buckets]

    def reshard_optimizer_state(self, states: list[dict], optimizer) -> dict:
        """This rank's optimizer state from every rank's of a run at another world size (checkpoint/reshard.py)."""
        from ddp_lab.checkpoint.reshard import reshard_zero_state
        return reshard_zero_state(states, self.group_sizes(), self.env.rank, self.env.world_size)

    def no_sync(self):
        return position.collective("gradient sync")  # every micro-batch reduce-scatters (see above)

    # ------------------------------------------------------------ in the backward
    def _start_backward(self) -> None:
        self.ready = [0] * len(self.buckets)  # gradients finished, per bucket
        self.next = 0  # the next bucket to send: they go in order
        self.in_flight: list[tuple] = []  # (Pending, bucket, input) of builtin's and direct's
        self.queued = False

    def _grad_ready(self, p: nn.Parameter) -> None:
        if not self.queued:  # the first gradient of a backward: its end flushes and waits
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
            self.queued = True
        self.ready[self.bucket_of[id(p)]] += 1
        while self.next < len(self.buckets) and self.ready[self.next] == len(self.buckets[self.next]):
            self._send(self.next)
            self.next += 1

    def _bucket_grads(self, i: int) -> torch.Tensor:
        """Bucket i's gradients in one buffer of N chunks, copied out of the parameters, which drop them."""
        like = self.pieces[i]
        flat = torch.zeros(self.chunks[i] * self.env.world_size, dtype=like.dtype, device=like.device)
        for p, g in zip(self.buckets[i], views_into(flat, self.buckets[i])):
            if p.grad is not None:  # (none: unused this backward, its zeros stand for it)
                g.copy_(p.grad)
                p.grad = None
        return flat

    def _send(self, i: int) -> None:
        """Reduce-scatter bucket i's gradients."""
        with self._timed():
            c, flat = self.chunks[i], self._bucket_grads(i)
            self.count(flat.numel() * flat.element_size() // 2)  # half an all-reduce's (as counted)
            if self.cfg.algo == "builtin":
                out = torch.empty(c, dtype=flat.dtype, device=flat.device)
                work = TORCH_REDUCE_SCATTER(out, flat, op=dist.ReduceOp.SUM, async_op=True)
                pending = Pending([work], lambda: out)
            elif self.cfg.algo == "direct":  # ours, in place: chunk r of `flat` ends with the sum
                pending = direct_reduce_scatter(flat, async_op=True)
            else:  # ours, in place, done before it returns
                self._land(Pending([], lambda: ring_textbook_reduce_scatter(flat)), i, flat)
                return
            self.in_flight.append((pending, i, flat))
            while len(self.in_flight) > IN_FLIGHT:
                self._land(*self.in_flight.pop(0))

    def _land(self, pending: Pending, i: int, flat: torch.Tensor) -> None:
        """Wait for bucket i's reduce-scatter; add its mean to this rank's chunk's gradient.
        (`flat` rides along in in_flight so that the backend can read it in the background until here.)"""
        self.pieces[i].grad.add_(pending.wait().div_(self.env.world_size))

    def _end_backward(self) -> None:
        self._wait_gathers()  # (direct: a bucket no forward used; before the step changes what it sends)
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
        self.count(self.weights.numel() * self.weights.element_size() // 2, len(self.buckets))  # the other half
        with position.collective("weight sync"), self._timed(), torch.no_grad():
            for i in reversed(range(len(self.buckets))):  # the forward's order: its first bucket first
                span = self.spans[i]
                if self.cfg.algo == "builtin":
                    TORCH_ALL_GATHER(self.weights[span], self.pieces[i].detach().clone())
                elif self.cfg.algo == "direct":  # waited for by the forward (or whatever reads the weights)
                    self.gathering[i] = direct_all_gather(self.weights[span], async_op=True)
                else:
                    ring_textbook_all_gather(self.weights[span])

    def _wait_gathers(self, buckets=None) -> None:
        """Wait for the all-gathers under way of `buckets` (None: all), as before reading their weights."""
        if not self.gathering:
            return
        with position.collective("weight sync"), self._timed():
            for i in (list(self.gathering) if buckets is None else buckets):
                if i in self.gathering:
                    self.gathering.pop(i).wait()

    def finish(self, step: int) -> None:
        self._wait_gathers()

    @contextlib.contextmanager
    def consensus(self):
        self._wait_gathers()
        yield

    @contextlib.contextmanager
    def whole_weights(self):
        self._wait_gathers()
        yield

    def model_state_dict(self, model: nn.Module) -> dict:
        self._wait_gathers()
        return model.state_dict()

    def load_model_state_dict(self, model: nn.Module, state: dict) -> None:
        self._wait_gathers()
        model.load_state_dict(state)

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        return clip_sharded([self.grads], max_norm)  # this rank's chunks, one buffer

    def describe(self) -> str:
        return f"zero2/{self.cfg.algo}"
