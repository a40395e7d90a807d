"""What every sync strategy shares: what it can do (Capabilities), timing its communication, counting its bytes.

Communication time (``comm_seconds``, ``comm_timing``):

* ``after_backward`` (flat, per_param): the wall time of after_backward (flat with its all-reduces
  started in the backward: the wait for what is still in flight, the communication the step pays).
* ``hook`` (ddp with algo != builtin): the time spent inside the hook. The
  hooks run while backward is still computing other buckets' gradients, so
  this is an upper bound of the communication cost the step actually sees.
* ``unmeasured`` (ddp with algo=builtin, any compress): DDP's allreduce is
  asynchronous; timing it would mean waiting for it inside the hook, which
  removes the very overlap being measured. No figure is reported (null).
* ``none``: a single process, nothing to communicate (0).

On CUDA the time is taken with CUDA events around the work on the current
stream (no extra synchronisation), read when ``comm_seconds`` is read. Only
steps taken while ``measuring`` is true count; the trainer sets it for the
steps its throughput window counts.

``sync.poll`` -- whether a CPU rank waits for the backend's own allreduce
(algo=builtin) by polling rather than sleeping: decided at start-up with the
rest of the machine tuning (ddp_lab.tuning, which says why) and handed in as
``env.poll``. With mode=ddp it waits on the backward's last bucket only, so
earlier buckets still overlap the backward. Our own algorithms always block:
gloo's send/recv works cannot be asked whether they are done.
"""
from __future__ import annotations

import contextlib
import math
import time
import weakref
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from ddp_lab.distributed import DistEnv
from ddp_lab.sync.by_name import copy_by_name, layout_of, param_names, plain_name, state_of
from ddp_lab.telemetry import position


@dataclass(frozen=True)
class Capabilities:
    """What the Trainer, the checkpoint and the guards may rely on, one record per strategy class."""

    # the gradients travel in the last backward (DDP's buckets, zero's hooks), not in after_backward:
    # where the watchdog marks the gradient sync
    syncs_in_backward: bool = False
    # each rank steps the optimizer on its own shard (zero, fsdp): its optimizer state is checkpointed
    # by every rank, and the gradients differ between ranks after the sync
    shards: bool = False
    # each forward gathers the weights (zero stage 3, fsdp): a collective, so every rank must run as
    # many forwards as the others, evaluating too
    forward_gathers: bool = False
    # the weights differ between the ranks between syncs (local_sgd, diloco): each rank's weights and
    # optimizer state are checkpointed
    diverges: bool = False
    # False where .grad must stay allocated between steps (flat: views into its buffer), so the
    # trainer calls zero_grad(set_to_none=caps.grads_set_to_none)
    grads_set_to_none: bool = True
    # what is cut N ways between steps: 0 nothing, 1 the optimizer state, 2 also the gradients, 3 also
    # the weights (the memory estimate's ZeRO stage)
    sharding: int = 0
    # why the model must run eagerly ("" where it may be compiled): trainer.compile=true is refused then
    eager: str = ""
    # the optimizer steps flat chunks of many tensors (zero), not the tensors: it must treat each element alone
    flat_shards: bool = False


@dataclass(frozen=True)
class SyncContext:
    """What the builder hands every strategy besides its options; a strategy reads what it uses."""

    init: object = None  # models/meta_init.py's MetaInit: the model is on the meta device, built a unit at a time
    no_decay: frozenset = frozenset()  # optim.no_decay's parameter names (zero lays their chunks apart)
    param_dtype: torch.dtype | None = None  # stage 3, fsdp under trainer.amp=bf16: the weights gathered in it
    islands: object = None  # islands/layout.py's Islands: a periodic strategy running across them
    trained: Callable[[], list] | None = None  # the tensors a periodic strategy averages (sharded inside: shards)
    identity: str = ""  # torchft islands: a hash of the config's hashed keys and the code, alike on every island


NO_CONTEXT = SyncContext()


class ReplicaSync:
    """No communication at all: a single process, or the base of the others."""

    comm_timing = "none"  # see the module docstring
    caps = Capabilities()

    def __init__(self, model: nn.Module, env: DistEnv):
        self.model = model
        self.module: nn.Module = model
        self.env = env
        self.measuring = True  # count communication time of the current step
        # bytes this rank handed to all-reduces, counted at each call (a ring all-reduce
        # then sends 2(N-1)/N of them out of the rank): summary.json's wire_bytes_per_step;
        # and the collectives that carried them, each paying the link's latency once
        self.wire_bytes = 0
        self.collectives = 0
        self.wire_bytes_across = 0  # sync.islands, HSDP: those of wire_bytes that crossed between islands,
        self.collectives_across = 0  # in so many of the collectives
        # the ranks one copy of a sharded state is cut over (zero, fsdp): the world's, or an island's (islands,
        # HSDP), noted in each rank's checkpoint (checkpoint/state.py)
        self.shards_over = env.world_size
        self._seconds = 0.0
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    @property
    def comm_seconds(self) -> float:
        """Time in gradient communication, summed over the measured steps."""
        if self._events:
            for start, end in self._events:
                end.synchronize()
                self._seconds += start.elapsed_time(end) / 1000
            self._events.clear()
        return self._seconds

    def comm_figures(self, steps: int, seconds: float) -> tuple[float, float]:
        """(ms of communication per step, its share of the step time) over `steps`
        measured steps that took `seconds`; NaN where not measured."""
        if self.comm_timing == "unmeasured" or steps == 0:
            return math.nan, math.nan
        comm = self.comm_seconds
        return 1000 * comm / steps, (comm / seconds if seconds > 0 else math.nan)

    def count(self, nbytes: int, collectives: int = 1, across: bool = False) -> None:
        """Note `nbytes` handed to the network in `collectives` calls (ddp_lab.tools.costmodel.strategies
        prices both: the bytes by the link's bandwidth, each call by its latency); `across`: between
        islands (sync.islands), over the slow link."""
        self.wire_bytes += nbytes
        self.collectives += collectives
        self.wire_bytes_across += nbytes if across else 0
        self.collectives_across += collectives if across else 0

    def counts(self) -> dict[str, int]:
        """What this launch handed to the network so far (summary.json's *_to_target, checkpoints)."""
        return {"wire_bytes": self.wire_bytes, "collectives": self.collectives,
                "wire_bytes_across": self.wire_bytes_across, "collectives_across": self.collectives_across}

    @contextlib.contextmanager
    def uncounted(self):
        """Collectives that are not a training step's (an evaluation's, a checkpoint's): not counted."""
        was = self.wire_bytes, self.collectives, self.wire_bytes_across, self.collectives_across
        try:
            yield
        finally:
            self.wire_bytes, self.collectives, self.wire_bytes_across, self.collectives_across = was

    @contextlib.contextmanager
    def _timed(self):
        """Add the enclosed communication to comm_seconds (when measuring)."""
        if not self.measuring:
            yield
            return
        if self.env.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((start, end))
        else:
            t0 = time.perf_counter()
            yield
            self._seconds += time.perf_counter() - t0

    no_decay: frozenset = frozenset()  # optim.no_decay's parameter names (build_sync sets them)

    def parameters(self) -> list:
        """What this rank's optimizer steps: the model's parameters (zero: this rank's shard)."""
        return list(self.model.parameters())

    def state_tensors(self) -> list[torch.Tensor]:
        """Tensors the strategy keeps between steps beside the model and its optimizer (DiLoCo's anchor, outer
        momentum, residuals, what is in flight): counted in model_state_bytes. Every-step strategies: none."""
        return []

    def trained_shards(self) -> list[torch.Tensor]:
        """The trained weights as this rank holds them, tensors a periodic strategy may change in place (sync.islands
        across a sharding inner strategy): the trainable parameters (zero stage 3: this rank's pieces; fsdp: its
        rows). Asked anew each time: fsdp may replace its local tensors."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def param_groups(self) -> list[dict]:
        """parameters() in the optimizer's groups: the trainable ones decayed, then optim.no_decay's with
        weight_decay 0 (a group left out where empty)."""
        groups: list[list] = [[], []]
        for name, p in self.model.named_parameters():
            if p.requires_grad:
                groups[plain_name(name) in self.no_decay].append(p)
        return [{"params": ps, **({"weight_decay": 0.0} if g else {})} for g, ps in enumerate(groups) if ps]

    def optimizer_layout(self) -> list[dict] | None:
        """Each optimizer parameter's model parameters ([names, shape] each) and how a rank holds its state: whole
        here (zero: "flat" chunks of them, fsdp: "rows"). A checkpoint records it: what a resume under another
        sync mode reads (checkpoint/whole_state.py)."""
        return layout_of([[p] for group in self.param_groups() for p in group["params"]], self.model, "whole")

    def load_whole_optimizer_state(self, optimizer, by_name: dict) -> None:
        """Optimizer state read whole, by parameter name (checkpoint/whole_state.py), into this strategy's."""
        names = param_names(self.model)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        state = {i: dict(state_of(by_name, names[id(p)])) for i, p in enumerate(params)}
        optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Scale the gradients this rank steps with so that their norm over the whole model is at
        most max_norm; returns the norm before. The gradients are the same on every rank here (or
        each rank's own, where the ranks step alone), so each rank can do it alone."""
        return torch.nn.utils.clip_grad_norm_(self.parameters(), max_norm)

    def no_sync(self):
        return contextlib.nullcontext()

    def during_backward(self, last: bool):
        """The context of a micro-batch's forward and backward: no_sync() but for the
        step's last one, which syncs where the strategy syncs in backward."""
        if not last:
            return self.no_sync()
        return position.collective("gradient sync") if self.caps.syncs_in_backward else contextlib.nullcontext()

    def after_backward(self) -> None:
        pass

    # Weights that differ between the ranks (local_sgd, diloco) -------------
    # Every other strategy keeps the ranks' weights identical: these are no-ops.

    def agreed(self) -> bool:
        """Whether the optimizer may step now (sync=ft_ddp: every torchft island present exchanged this step's
        gradients); elsewhere always."""
        return True

    def after_step(self, step: int) -> None:
        """After optimizer step `step` (1-based, the run's count)."""

    def synced_at(self, step: int) -> bool:
        """Whether every rank holds the same weights after optimizer step `step`."""
        return True

    def quorum_due(self, step: int) -> bool:
        """Across torchft islands (the strategy across them), whether the islands present meet after step `step`:
        at a round's start."""
        return self.synced_at(step)

    def finish(self, step: int) -> None:
        """Before the final model is written: leave every rank with the same weights."""

    def consensus(self):
        """A context in which the model holds the weights an evaluation scores."""
        return contextlib.nullcontext()

    def whole_weights(self):
        """A context in which the model holds all its weights (zero stage 3 gathers them: every rank
        enters it)."""
        return contextlib.nullcontext()

    def model_state_dict(self, model: nn.Module) -> dict:
        """The whole model's state_dict, for state.pt, where every rank holds the weights whole (a strategy
        that shards them saves sharded_state() instead: checkpoint/state.py)."""
        return model.state_dict()

    def each_weight(self, model: nn.Module):
        """The model's state_dict an entry at a time, for model.pt (rank 0 writes each as it comes): every
        rank runs it to the end (sharded weights: each is gathered, a collective, and dropped after)."""
        yield from model.state_dict().items()

    def state_layout(self, model: nn.Module) -> dict:
        """The state_dict each_weight() hands out, its tensors needing only their shapes and dtypes (model.pt's
        layout: training/model_file.py)."""
        return model.state_dict(keep_vars=True)

    def load_model_state_dict(self, model: nn.Module, state) -> None:
        """Load whole weights by state_dict name (a dict, or a Mapping read a tensor at a time: a checkpoint's,
        checkpoint/whole_state.py; every rank is given the same; sharded: each copies in only its piece).
        ValueError naming the first weight missing or of another shape."""
        if isinstance(state, dict):  # (this mode's own checkpoint: torch's loader, with its checks and hooks)
            model.load_state_dict(state)
        else:
            copy_by_name(model, state)

    def state_dict(self) -> dict:
        """The strategy's state every rank shares (rank 0's is checkpointed)."""
        return {}

    def own_state_dict(self) -> dict:
        """The strategy's state that differs between ranks (each rank's is checkpointed)."""
        return {}

    def load_state_dict(self, shared: dict, own: dict | None) -> None:
        """Resume; own is None at another world size (the rule: docs/bandwidth.md)."""

    def join(self, send: Callable[[], dict], take: Callable[[dict], None], step: int) -> dict | None:
        """Before the first step, meet the other replica groups (sync.fault_tolerance=torchft: islands/
        replica_group.py), taking a peer's state through `take` where this one is behind (returns what the heal
        took), giving its own through `send` to a joiner later; elsewhere nothing."""
        return None

    def counted(self, step: int) -> None:
        """Step `step` is taken and counted by the trainer (its state is a checkpoint's at `step`): torchft islands
        meet here at a round's start (islands/replica_group.py), an island behind taking a peer's state."""

    def summary_fields(self) -> dict:
        """What summary.json adds for this strategy (torchft islands: the membership over time)."""
        return {}

    def scalars(self) -> dict[str, float]:
        """What TensorBoard shows of this strategy at a logged step (torchft islands: the islands present)."""
        return {}

    def close(self) -> None:
        """Let go of what outlives a step (torchft's Manager and its servers)."""

    def describe(self) -> str:
        return "none"


def polls(cfg, env: DistEnv) -> bool:
    """Whether this rank waits for the builtin allreduce by polling (sync.poll, see ddp_lab.tuning)."""
    return env.poll and cfg.algo == "builtin"


def weak_hook(method, *bound) -> Callable:
    """A parameter's hook calling the strategy's `method(*bound, *args)` for as long as the strategy lives.

    A parameter's post-accumulate-grad hooks live in C++, out of gc's sight: a hook holding the strategy, which
    holds the parameters, kept both, the gradients' buffers with them, alive to the process's end."""
    ref = weakref.WeakMethod(method)

    def hook(*args) -> None:
        strategy_method = ref()
        if strategy_method is not None:
            strategy_method(*bound, *args)
    return hook


def first_rank(group=None) -> int:
    """The global rank of `group`'s rank 0 (None: the whole world's), the source of its broadcasts."""
    return 0 if group is None else dist.get_global_rank(group, 0)


def broadcast_from_rank0(model: nn.Module, group=None) -> None:
    """Every rank starts from rank 0's parameters and buffers (DDP does this itself); `group`: the
    ranks of an island (sync.islands) from their first."""
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t.data, src=first_rank(group), group=group)


def broadcast_buffers_each_step(model: nn.Module, group=None) -> None:
    """Before each training forward, rank 0's buffers to every rank (of `group`), as DDP does
    (broadcast_buffers): a BatchNorm's running statistics, which each rank's own batches would otherwise
    move apart. One broadcast per dtype. Only the state_dict's buffers (a non-persistent one, a causal
    mask, is rebuilt alike by every rank); nothing is hooked where the model has none."""
    persistent = set(model.state_dict(keep_vars=True))
    buffers = [b for name, b in model.named_buffers() if name in persistent]  # (real by now: the sync has built)
    if not buffers:
        return
    by_dtype = [[b for b in buffers if b.dtype == d] for d in sorted({b.dtype for b in buffers}, key=str)]
    src = first_rank(group)

    def broadcast(module: nn.Module, _args) -> None:
        if not (module.training and torch.is_grad_enabled()):
            return
        with torch.no_grad(), position.collective("buffer broadcast"):
            for same in by_dtype:
                flat = torch.cat([b.reshape(-1) for b in same])
                dist.broadcast(flat, src=src, group=group)
                for b, part in zip(same, flat.split([b.numel() for b in same])):
                    b.copy_(part.view_as(b))

    model.register_forward_pre_hook(broadcast)
