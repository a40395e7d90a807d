"""sync=zero (sync.zero_stage=1): ZeRO stage 1, each rank keeps the optimizer state of its own shard only.
The base of stages 2 (zero2.py) and 3 (zero3.py): the layout, the schedule and the all-gather are here.

ZeRO (Rajbhandari et al. 2019) splits what every DDP rank holds N ways. Stage 1 shards the
optimizer state: with AdamW in fp32 a rank holds 4 bytes of weights, 4 of gradients and
8/N of moments per parameter, 8 + 8/N instead of DDP's 16, for the same bytes on the wire.

The layout: the parameters go into buckets of at most sync.bucket_cap_mb, in the reverse of the
model's order (roughly the order the backward finishes them, as DDP's buckets). Each bucket is a
slice of one flat weight buffer, padded to N equal chunks, every parameter a view into it, so the
model computes as before; rank r steps chunk r of every bucket (one optimizer parameter per
bucket, a view of the weights). A step:

1. backward accumulates each gradient into a whole gradient buffer laid out as the weights;
2. a hook on each parameter counts the gradients autograd has finished; as soon as a bucket's
   are all there (in the step's last micro-batch), it is reduce-scattered, in bucket order (the
   same on every rank, whatever order they finish in), during the rest of the backward as DDP's
   all-reduce is: rank r ends with the sum of chunk r of every rank's gradients, / N, which is
   what its optimizer steps. sync.algo=builtin (torch's) and direct (ours, collectives/direct.py)
   run asynchronously, at most two in flight; ring_textbook runs ours inside the hook. At the end
   of the backward (a callback autograd runs) the buckets no hook completed (parameters without
   a gradient this time) are sent as zeros, and every one is waited for;
3. the optimizer steps chunk r of each bucket alone (a view of the weights, so the model's own
   parameters change with it): its state is 1/N of DDP's;
4. all-gather: every rank's new chunks reach every other rank (after_step). Under
   sync.algo=direct every bucket's all-gather is posted at once, in the forward's order, and the
   next forward waits for a bucket only in the pre-hook of a module that holds one of its
   parameters: the weights travel while the forward computes (DDP's all-reduce has no such second
   half to hide). Whatever reads the weights first waits for all (_wait_gathers).

2 and 4 together are one all-reduce's traffic, split around the optimizer step. Under
trainer.grad_accum stage 1 keeps the gradients whole between micro-batches, so it accumulates
locally and sends once a step (stage 2 sends every micro-batch). sync.algo=builtin runs torch's
reduce_scatter_tensor and all_gather_into_tensor (gloo sums, then this divides: its ReduceOp.AVG
is wrong, pytorch#162338); ring_textbook and direct run ours (collectives/ring_textbook.py,
collectives/direct.py). Communication time: the time inside the hooks and waiting at the end
(comm_timing "hook").

The stages differ in three overridable steps of construction: _prepare (stage 3 returns freed
blocks to the kernel), _lay_out (stage 3 lays out units it frees between uses) and _attach_grads
(stage 1 a whole gradient buffer; stages 2 and 3 this rank's chunks only).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

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
from ddp_lab.config.keys import key
from ddp_lab.distributed import DistEnv
from ddp_lab.sync.base import (
    NO_CONTEXT,
    Capabilities,
    ReplicaSync,
    SyncContext,
    broadcast_buffers_each_step,
    broadcast_from_rank0,
    weak_hook,
)
from ddp_lab.sync.by_name import layout_of, param_names, plain_name, state_named
from ddp_lab.sync.options import Algo
from ddp_lab.sync.sharded.common import ALGOS, ShardedOptions, clip_sharded, trainable_parameters, views_into
from ddp_lab.telemetry import position

# builtin, direct: reduce-scatters launched and not yet waited for, each holding its bucket's gradients (stage 3
# keeps one: a unit's gradients are its largest buffer, and one in flight already covers the next unit's backward)
IN_FLIGHT = 2


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


def grouped_buckets(params: list[nn.Parameter], group: dict[int, int], cap_bytes: float):
    """(buckets, the optimizer group of each): buckets_of each group's parameters apart, so that a flat
    chunk never mixes two groups, ordered by when the backward finishes them (their earliest parameter
    in the model's order last)."""
    order = {id(p): i for i, p in enumerate(params)}
    out = []
    for g in sorted({group.get(id(p), 0) for p in params}):
        out += [(b, g) for b in buckets_of([p for p in params if group.get(id(p), 0) == g], cap_bytes)]
    out.sort(key=lambda bg: -min(order[id(p)] for p in bg[0]))
    return [b for b, _ in out], [g for _, g in out]


@dataclass
class ZeroOptions(ShardedOptions):
    # our direct reduce-scatter and all-gather: faster than torch's on gloo at every stage, on two kinds of CPU
    # (docs/memory.md cites the records)
    algo: Algo = key(Algo.direct, "the reduce-scatter and all-gather: builtin (gloo/NCCL) | ring_textbook | direct "
                                  "(ddp_lab.collectives)")
    zero_stage: int = key(1, "what is sharded over the ranks: 1 the optimizer state, 2 also the gradients, 3 also "
                             "the weights (gathered a unit at a time)", ok=lambda v: v in (1, 2, 3), rule="1, 2 or 3")
    bucket_cap_mb: float = key(25.0, "stages 1 and 2: gradients reduce-scattered in buckets of at most this many MB "
                                     "(0: one bucket)", at_least=0)
    prefetch: bool = key(True, "stage 3 with sync.algo=builtin or direct: start the next unit's gather while this "
                               "one computes (false: each unit gathered when it is needed)")
    overlap_reduce: bool = key(True, "sync.algo=builtin or direct: leave each gradient reduce-scatter under way while "
                                     "the backward goes on (at most 2 at stages 1 and 2, 1 at stage 3); false: wait "
                                     "for each where it is sent, its buffers gone before the next gradients are made "
                                     "(less memory at stages 2 and 3, no overlap: FSDP2's way on CPU)")

    def check(self, name: str) -> None:
        self.refuse_algo(name, ALGOS, "has no reduce-scatter and all-gather of its own")

    def strategy(self) -> type:
        from ddp_lab.sync.sharded import ZERO_STAGES
        return ZERO_STAGES[self.zero_stage]


class Zero1Sync(ReplicaSync):
    comm_timing = "hook"
    max_in_flight = IN_FLIGHT
    # each chunk's gradient is a view into one buffer kept between steps
    caps = Capabilities(syncs_in_backward=True, shards=True, grads_set_to_none=False, sharding=1, flat_shards=True)

    def __init__(self, model: nn.Module, env: DistEnv, cfg: ZeroOptions, ctx: SyncContext = NO_CONTEXT):
        super().__init__(model, env)
        init, no_decay = ctx.init, ctx.no_decay
        self.cfg, self.init = cfg, init  # init: a meta-device model's (stage 3 only), replayed by every rank
        if not cfg.overlap_reduce:
            self.max_in_flight = 0
        params = trainable_parameters(model, "sync=zero")
        self.no_decay = no_decay  # (optim.no_decay's parameter names: a group of their own, never in one chunk)
        self.group_of = {id(p): int(plain_name(n) in no_decay) for n, p in model.named_parameters()}
        self._prepare()
        if init is None:
            broadcast_from_rank0(model, env.group)
        self._lay_out(model, params)
        params = [p for p in model.parameters() if p.requires_grad]  # (made anew from a meta-device model)
        self._attach_grads()
        broadcast_buffers_each_step(model, env.group)  # (as DDP: a BatchNorm's running statistics are rank 0's)
        self.hooks = [p.register_post_accumulate_grad_hook(weak_hook(self._grad_ready)) for p in params]
        self._start_backward()

    # ------------------------------------------------------------ construction, by stage
    def _prepare(self) -> None:
        """Before the weights move (stage 3: freed gathers go back to the kernel)."""

    def _lay_out(self, model: nn.Module, params: list[nn.Parameter]) -> None:
        """Buckets of one flat weight buffer (the model's parameters become views into it) and this
        rank's chunk of each, the optimizer's parameters."""
        n, r = self.env.world_size, self.env.rank
        self.buckets, self.groups = grouped_buckets(params, self.group_of, self.cfg.bucket_cap_mb * 2**20)
        self.chunks = [-(-sum(p.numel() for p in b) // n) for b in self.buckets]  # ceil: the last one padded
        starts = [0]
        for c in self.chunks:
            starts.append(starts[-1] + c * n)
        self.spans = [slice(a, b) for a, b in zip(starts, starts[1:])]  # each bucket's slice of the weights
        self.weights = torch.zeros(starts[-1], dtype=params[0].dtype, device=params[0].device)
        self.shard_size = sum(self.chunks)
        self.pieces = []  # this rank's chunk of each bucket: the optimizer's parameters
        with torch.no_grad():
            for bucket, span, c in zip(self.buckets, self.spans, self.chunks):
                for p, w in zip(bucket, views_into(self.weights[span], bucket)):
                    w.copy_(p)
                    p.data = w  # the model's weights now live in the flat buffer
                self.pieces.append(nn.Parameter(self.weights[span][r * c:(r + 1) * c]))
        self.bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        self.gathering: dict[int, Pending] = {}  # direct: bucket -> its all-gather under way
        if self.cfg.algo == "direct":
            for m in model.modules():
                mine = sorted({self.bucket_of[id(p)] for p in m.parameters(recurse=False) if id(p) in self.bucket_of})
                if mine:
                    m.register_forward_pre_hook(lambda _m, _a, mine=mine: self._wait_gathers(mine))

    def _attach_grads(self) -> None:
        """One whole gradient buffer laid out as the weights: backward accumulates into it, and
        this rank's chunk of it is its piece's gradient."""
        r = self.env.rank
        self.whole_grads = torch.zeros_like(self.weights)
        self.grad_views = []  # per bucket, each parameter's view of the whole gradient buffer
        for bucket, span, c, piece in zip(self.buckets, self.spans, self.chunks, self.pieces):
            views = views_into(self.whole_grads[span], bucket)
            for p, g in zip(bucket, views):
                p.grad = g  # backward accumulates into the buffer
            self.grad_views.append(views)
            piece.grad = self.whole_grads[span][r * c:(r + 1) * c]  # where the mean of this rank's chunk lands
        self.accumulating = False

    def _in_optimizer_order(self, per_bucket: list) -> list:
        """`per_bucket` (one item per bucket, or stage 3 unit) in the optimizer's order: by group, then bucket."""
        return [x for g in sorted(set(self.groups)) for x, h in zip(per_bucket, self.groups) if h == g]

    def parameters(self):
        return self._in_optimizer_order(self.pieces)

    def param_groups(self) -> list[dict]:
        """This rank's chunks by optimizer group: decayed, then optim.no_decay's (weight_decay 0)."""
        return [{"params": [p for p, h in zip(self.pieces, self.groups) if h == g],
                 **({"weight_decay": 0.0} if g else {})} for g in sorted(set(self.groups))]

    def group_sizes(self) -> list[int]:
        """The unpadded elements of each bucket (stage 3: unit), as parameters() lists their chunks."""
        return self._in_optimizer_order([sum(p.numel() for p in b) for b in self.buckets])

    def optimizer_layout(self) -> list[dict] | None:
        return layout_of(self._in_optimizer_order(self.buckets), self.model, "flat")

    def load_whole_optimizer_state(self, optimizer, by_name) -> None:
        """Whole state by parameter name (checkpoint/whole_state.py's, read a parameter at a time), cut to this
        rank's chunk of each group: of each parameter's state only the elements the chunk covers are read."""
        from ddp_lab.checkpoint.reshard import flat_rows
        names, r, n, state = param_names(self.model), self.env.rank, self.env.world_size, {}
        for i, (bucket, size) in enumerate(zip(self._in_optimizer_order(self.buckets), self.group_sizes())):
            first, chunk = state_named(by_name, names[id(bucket[0])]), -(-size // n)
            state[i] = {}
            for what, value in first.items():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    value = flat_rows((state_named(by_name, names[id(p)])[what] for p in bucket), r * chunk,
                                      min((r + 1) * chunk, size), chunk, value.dtype)
                elif isinstance(value, torch.Tensor):  # (AdamW's step count, a copy: no two chunks share one)
                    value = value.clone()
                state[i][what] = value
        optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})

    def reshard_optimizer_state(self, states: list[dict], optimizer) -> dict:
        """This rank's optimizer state from every rank's of a run at another world size (checkpoint/reshard.py)."""
        from ddp_lab.checkpoint.reshard import reshard_zero_state
        return reshard_zero_state(states, self.group_sizes(), self.env.rank, self.env.world_size)

    @contextlib.contextmanager
    def no_sync(self):
        """A micro-batch but the step's last: the gradients accumulate, nothing is sent."""
        self.accumulating = True
        try:
            yield
        finally:
            self.accumulating = False

    # ------------------------------------------------------------ in the backward
    def _start_backward(self) -> None:
        self.ready = [0] * len(self.buckets)  # gradients finished, per bucket
        self.next = 0  # the next bucket to send: they go in order
        self.in_flight: list[tuple] = []  # (Pending, bucket, input) of builtin's and direct's
        self.queued = False

    def _grad_ready(self, p: nn.Parameter) -> None:
        if self.accumulating:
            return
        if not self.queued:  # the first gradient of a backward: its end flushes and waits
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
            self.queued = True
        self.ready[self.bucket_of[id(p)]] += 1
        while self.next < len(self.buckets) and self.ready[self.next] == len(self.buckets[self.next]):
            self._send(self.next)
            self.next += 1

    def _bucket_grads(self, i: int) -> torch.Tensor:
        """Bucket i's slice of the whole gradient buffer (a .grad replaced since goes back into it)."""
        for p, g in zip(self.buckets[i], self.grad_views[i]):
            if p.grad is None:
                p.grad = g  # (unused: its zeros stand for it)
            elif p.grad.data_ptr() != g.data_ptr():
                g.copy_(p.grad)
                p.grad = g
        return self.whole_grads[self.spans[i]]

    def _send(self, i: int) -> None:
        """Reduce-scatter bucket i's gradients (the oldest in flight landed first, so that at most
        max_in_flight buffers exist beside the one being filled; none: landed here)."""
        with self._timed():
            while self.in_flight and len(self.in_flight) >= self.max_in_flight:
                self._land(*self.in_flight.pop(0))
            c, flat = self.chunks[i], self._bucket_grads(i)
            self.count(flat.numel() * flat.element_size() // 2)  # half an all-reduce's (as counted)
            if self.cfg.algo == "builtin":
                out = torch.empty(c, dtype=flat.dtype, device=flat.device)
                work = TORCH_REDUCE_SCATTER(out, flat, op=dist.ReduceOp.SUM, group=self.env.group, async_op=True)
                pending = Pending([work], lambda: out)
            elif self.cfg.algo == "direct":  # ours, in place: chunk r of `flat` ends with the sum
                pending = direct_reduce_scatter(flat, async_op=True)
            else:  # ours, in place, done before it returns
                self._land(Pending([], lambda: ring_textbook_reduce_scatter(flat)), i, flat)
                return
            self.in_flight.append((pending, i, flat))
            if not self.max_in_flight:  # sync.overlap_reduce=false
                self._land(*self.in_flight.pop())

    def _land(self, pending: Pending, i: int, flat: torch.Tensor) -> None:
        """This rank's chunk of bucket i <- its mean; the others' chunks zeroed (the next step's start).
        (`flat` rides along in in_flight so that the backend can read it in the background until here.)"""
        mean = pending.wait().div_(self.env.world_size)
        grad = self.pieces[i].grad
        if mean.data_ptr() != grad.data_ptr():  # builtin: it came in an output of its own
            grad.copy_(mean)
        r, c = self.env.rank, self.chunks[i]
        flat[:r * c].zero_()
        flat[(r + 1) * c:].zero_()

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
                    TORCH_ALL_GATHER(self.weights[span], self.pieces[i].detach().clone(), group=self.env.group)
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

    def load_model_state_dict(self, model: nn.Module, state) -> None:
        self._wait_gathers()
        super().load_model_state_dict(model, state)

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        return clip_sharded([p.grad for p in self.pieces], max_norm, self.env.group)

    def describe(self) -> str:
        waits = not self.cfg.overlap_reduce and self.cfg.algo in ("builtin", "direct")  # (ring_textbook always does)
        return f"zero{self.caps.sharding}/{self.cfg.algo}{'+wait' if waits else ''}"
