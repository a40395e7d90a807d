"""sync=fsdp: torch's FSDP2 (`fully_shard`), beside our own ZeRO stage 3 (zero3.py).

FSDP2 shards every parameter over the ranks as a DTensor (dim 0, rank r holds rows r/N of it)
and, like stage 3, gathers a unit's weights before its forward and its backward and frees them
after, reduce-scattering its gradients in the backward. It is applied as torchtitan applies it:
`fully_shard` on each unit (units.py: the repeated block class at any depth, else by size, or the
classes sync.shard_units names), then on the whole model, whose own and tied parameters form the
root unit. On a GPU it gathers the next unit ahead on a stream of its own, as ours does (sync.prefetch); on
CPU it waits for each collective where it starts it, unless sync.overlap (gather_ahead, fsdp_direct.py). Under
trainer.amp=bf16 the units are gathered in bf16 and the fp32 shards stepped (FSDP2's MixedPrecisionPolicy).

sync.islands=host|K makes it HSDP: a 2-D mesh, FSDP2 sharding over an island's K ranks (its fast link)
and all-reducing each reduce-scattered shard across the islands every step (1/K of the gradients a rank).

On gloo it is made to sum and divide (`set_force_sum_reduction_for_comms`): gloo's
reduce-scatter with ReduceOp.AVG summed (pytorch#162338, open when this was written; torch
2.14.1 averages); tests/sync/test_fsdp.py checks that collective and fails if the bug returns.

The parameters, gradients and the optimizer's state are DTensors: this rank's optimizer steps
its own rows, and a checkpoint holds this rank's rows of each parameter and of its optimizer
state (sharded_state; a DTensor saves and loads with `torch.load(weights_only=True)`); at
another world size a rank reads its rows from the old ranks that held them (checkpoint/reshard.py's
my_rows). Built from a meta-device model (models/meta_init.py), each unit is made whole,
initialised as the whole build would and sharded before the next is made; model.pt is written a
parameter at a time, each gathered whole and dropped (each_weight): no rank holds the whole model.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ddp_lab.checkpoint.reshard import my_rows, stepped, unmapped
from ddp_lab.config import ConfigError
from ddp_lab.config.keys import key
from ddp_lab.distributed import DistEnv, host_malloc
from ddp_lab.models.meta_init import MetaInit, real_buffers, real_copy, swap_parameters
from ddp_lab.sync.base import (
    NO_CONTEXT,
    Capabilities,
    ReplicaSync,
    SyncContext,
    broadcast_buffers_each_step,
    broadcast_from_rank0,
)
from ddp_lab.sync.by_name import layout_of, param_names, state_named, weight_of
from ddp_lab.sync.islands.layout import ISLANDS_HELP, island_shape, islands_spec_ok
from ddp_lab.sync.sharded.common import (
    REDUCE_DTYPES,
    ShardedOptions,
    clip_sharded,
    load_whole_part,
)
from ddp_lab.sync.sharded.fsdp_direct import custom_reduce_scatter
from ddp_lab.sync.sharded.outside_use import check_first_forward
from ddp_lab.sync.sharded.units import announce, unit_modules

OVERLAP_IN_FLIGHT = 1  # sync.overlap: reduce-scatters left travelling when the next is posted (zero3.py's bound)


@dataclass
class FSDPOptions(ShardedOptions):
    islands: str = key("none", ISLANDS_HELP + ": HSDP, FSDP2 sharding inside each island and all-reducing the "
                               "gradients' shards across every step", ok=islands_spec_ok,
                       rule="none, host or a positive integer")
    overlap: bool = key(False, "on gloo: start each unit's gather while the unit before it computes, and with "
                               "sync.algo=direct return from each gradient reduce-scatter with it under way (at most "
                               f"{OVERLAP_IN_FLIGHT} left travelling; the backward's end finishes it): FSDP2 waits for "
                               "each collective where it starts it on CPU, which has no streams. It holds one more "
                               "unit gathered and a reduce-scatter's buffers")

    def check(self, name: str) -> None:
        self.refuse_algo(name, ("builtin", "direct"), "cannot run inside torch's FSDP2 (sync=zero runs ring_textbook; "
                                                      "direct here is the gradients' reduce-scatter)")


def fully_shard_or_refuse():
    """torch's fully_shard, or a one-line refusal on a torch without it (before 2.6 it was private)."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        raise ConfigError(f"sync=fsdp needs torch.distributed.fsdp.fully_shard (torch >= 2.6); this "
                          f"torch is {torch.__version__}: upgrade torch, or use sync=zero "
                          f"sync.zero_stage=3") from None
    return fully_shard


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's rows of a DTensor (a plain tensor as it is)."""
    return t.to_local() if hasattr(t, "to_local") else t


def gather_ahead(order: list[nn.Module], backend: str) -> None:
    """sync.overlap: each unit's gather (the root first, then the units in `order`) started as soon as the one before
    it has its weights, and waited for only by its own forward (in the backward, FSDP2's default order ahead); a
    one-line refusal off gloo, where FSDP2 overlaps on its CUDA streams."""
    if backend != "gloo":
        raise ConfigError(f"sync.overlap=true overlaps FSDP2's collectives on gloo; on {backend} FSDP2 overlaps "
                          f"them on its own streams: leave sync.overlap out")
    if not hasattr(order[0], "_set_unshard_async_op"):
        raise ConfigError(f"sync.overlap=true needs FSDP2's asynchronous unshard (torch >= 2.6); this torch is "
                          f"{torch.__version__}: leave sync.overlap out")
    for m, after in zip(order, order[1:]):
        m.set_modules_to_forward_prefetch([after])
    order[0]._set_unshard_async_op(True)  # (every unit's, below the root)


class FSDPSync(ReplicaSync):
    comm_timing = "unmeasured"  # FSDP's collectives run asynchronously inside its hooks
    caps = Capabilities(syncs_in_backward=True, shards=True, forward_gathers=True, sharding=3,
                        eager="sync=fsdp applies fully_shard to the eager model's blocks")

    def __init__(self, model: nn.Module, env: DistEnv, cfg: FSDPOptions, ctx: SyncContext = NO_CONTEXT):
        super().__init__(model, env)
        self.cfg, init, param_dtype = cfg, ctx.init, ctx.param_dtype
        fully_shard = fully_shard_or_refuse()
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy
        if init is None:  # (a meta-device build: every rank replays the same initialisation)
            broadcast_from_rank0(model, env.group)  # fully_shard keeps each rank's rows of its own tensors
        host_malloc.for_sharded(env.device)  # trainer.host_malloc=auto: lean
        with torch.no_grad():
            for p in model.parameters():  # FSDP2 shards contiguous rows only (trainer.channels_last is not)
                p.data = p.data.contiguous()
        # sync.islands (HSDP): a copy of the model in each island, sharded over its K ranks, the gradients'
        # shards all-reduced across the islands (the mesh's rows: an island's consecutive ranks)
        replicas, self.shards_over = (island_shape(str(cfg.islands), env) if str(cfg.islands) != "none"
                                      else (1, env.world_size))
        self.shard_rank = env.rank % self.shards_over
        if replicas > 1:
            mesh = init_device_mesh(env.device.type, (replicas, self.shards_over), mesh_dim_names=("across", "inside"))
            self.shard_group = mesh["inside"].get_group()
        elif env.group is not None:  # (inside an island, DiLoCo across: sync.inner=fsdp) the island's ranks
            from torch.distributed.device_mesh import DeviceMesh
            mesh, self.shard_group = DeviceMesh.from_group(env.group, env.device.type), env.group
        else:
            mesh, self.shard_group = init_device_mesh(env.device.type, (env.world_size,)), None
        self.replicas = replicas
        # trainer.amp=bf16: the weights gathered in bf16, the gradients reduce-scattered in sync.reduce_dtype, the
        # sharded fp32 ones stepped (FSDP2's MixedPrecisionPolicy, as zero stage 3 does it)
        reduce_dtype = REDUCE_DTYPES[cfg.reduce_dtype]
        policy = {"mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)} \
            if param_dtype is not None else {}
        mods = unit_modules(model, cfg.shard_units, cfg.unit_mb)
        owners = {}  # parameter -> how many units hold it; a tied one (the GPT's embedding) stays in the root
        for m in mods:
            for p in m.parameters():
                owners[p] = owners.get(p, 0) + 1
        self.units = [m for m in mods if all(owners[p] == 1 for p in m.parameters())]
        announce(model, self.units, cfg, env.is_main)
        if init is not None:  # each unit made whole, initialised and sharded before the next is made
            self._initialise(model, init, lambda m: fully_shard(m, mesh=mesh, **policy))
        else:
            for m in self.units:
                fully_shard(m, mesh=mesh, **policy)
        fully_shard(model, mesh=mesh, **policy)
        check_first_forward(model, self.units)
        broadcast_buffers_each_step(model, env.group)  # (as DDP: a BatchNorm's running statistics are rank 0's)
        # sync.overlap with algo=direct: reduce-scatters left travelling where FSDP2 reads their output no sooner
        # than the optimizer (no HSDP all-reduce after them, no cast from a bf16 reduce, no divide: direct averages)
        travels = (cfg.overlap and cfg.algo == "direct" and replicas == 1
                   and (param_dtype is None or reduce_dtype == torch.float32))
        if dist.get_backend() == "gloo" and not travels and hasattr(model, "set_force_sum_reduction_for_comms"):
            for m in [*self.units, model]:  # each unit's setting is its own
                m.set_force_sum_reduction_for_comms(True)
        self.reduce_scatter = None
        if cfg.algo == "direct":  # (half gloo's bytes: fsdp_direct.py)
            self.reduce_scatter = custom_reduce_scatter(dist.get_backend(), OVERLAP_IN_FLIGHT if travels else 0)
            for m in [*self.units, model]:
                m.set_custom_reduce_scatter(self.reduce_scatter)
        if cfg.overlap:
            gather_ahead([model, *self.units], dist.get_backend())
        # bytes handed to collectives, counted as zero stage 3 counts them (unpadded): each micro-batch
        # gathers a unit's weights twice (forward, backward; half an all-reduce's bytes each), the root's
        # once; the step's last micro-batch reduce-scatters the gradients (half an all-reduce's), the
        # trainable ones' only
        in_units = {id(p) for m in self.units for p in m.parameters()}
        size = {id(p): p.numel() * p.element_size() for p in model.parameters()}
        whole, root = sum(size.values()), sum(n for i, n in size.items() if i not in in_units)
        trained = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        gathered, reduced = ((param_dtype.itemsize / 4, reduce_dtype.itemsize / 4) if param_dtype is not None
                             else (1, 1))  # (of fp32 weights: bf16 halves them)
        self.gather_bytes = int(gathered * (whole - root + root // 2))
        self.scatter_bytes = int(reduced * trained // 2)
        has_root = root > 0  # (each unit: one all-gather in the forward, one in the backward, one reduce-scatter)
        trains = [any(p.requires_grad for p in m.parameters()) for m in self.units]
        root_trains = any(p.requires_grad and id(p) not in in_units for p in model.parameters())
        self.gathers, self.scatters = 2 * len(self.units) + has_root, sum(trains) + root_trains
        # HSDP: each reduce-scattered shard then all-reduced across the islands (1/K of the gradients)
        self.across_bytes = int(reduced * trained) // self.shards_over if replicas > 1 else 0
        self.forwards = 0  # training forwards since the last after_backward
        model.register_forward_pre_hook(lambda *_: setattr(self, "forwards", self.forwards + torch.is_grad_enabled()))

    def _initialise(self, model: nn.Module, init: MetaInit, shard) -> None:
        """A meta-device build (models/meta_init.py): the root's parameters (tied, the model's own) made real
        whole, then each unit's made, initialised as the whole build would and sharded, one at a time."""
        device = self.env.device
        in_units = {id(p) for m in self.units for p in m.parameters()}
        swap_parameters(model, {id(p): real_copy(p, device) for p in model.parameters() if id(p) not in in_units})
        real_buffers(model, device)
        root = [p for p in model.parameters() if not p.is_meta]
        paths = {id(m): path for path, m in model.named_modules()}

        def fill_rows(i: int, rows) -> None:  # (pretrained weights: this rank's rows of each, read from the file)
            with torch.no_grad():
                for name, p in self.units[i].named_parameters(paths[id(self.units[i])]):
                    mine = local(p)
                    if p.dim() == 0 or mine.shape[:1] == p.shape[:1]:  # (not cut: read whole)
                        got = rows(name, None, None)
                    else:  # FSDP2's rows: torch.chunk's of dim 0, ceil(R/N) a rank
                        c = -(-p.shape[0] // self.shards_over)
                        lo = min(self.shard_rank * c, p.shape[0])
                        got = rows(name, lo, lo + mine.shape[0])
                    if got is not None:
                        mine.copy_(got)

        init.materialise(self.units, root,
                         lambda i: swap_parameters(model, {id(p): real_copy(p, device)
                                                           for p in self.units[i].parameters()}),
                         lambda i: shard(self.units[i]), fill_rows)

    def trained_shards(self) -> list[torch.Tensor]:
        """This rank's rows of each trainable parameter (the DTensors' local tensors, asked anew: FSDP2 may
        replace them at its first forward)."""
        return [local(p) for p in self.model.parameters() if p.requires_grad]

    def no_sync(self):
        """Micro-batches before the last keep their whole gradients (FSDP's own no_sync)."""
        @contextlib.contextmanager
        def held():
            self.model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                self.model.set_requires_gradient_sync(True)
        return held()

    def after_backward(self) -> None:
        if self.reduce_scatter is not None:  # (sync.overlap: the reduce-scatters still travelling)
            self.reduce_scatter.drain()
        self.count(self.forwards * self.gather_bytes + self.scatter_bytes, self.forwards * self.gathers + self.scatters)
        if self.across_bytes:
            self.count(self.across_bytes, self.scatters, across=True)
        self.forwards = 0

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        grads = [local(p.grad) for p in self.model.parameters() if p.grad is not None]
        return clip_sharded(grads, max_norm, self.shard_group)  # (HSDP: every island holds the same shards)

    def load_model_state_dict(self, model: nn.Module, state) -> None:
        """Whole weights by name (a dict, or a checkpoint's Mapping read a tensor at a time: checkpoint/whole_state.py):
        each rank copies in only its rows of each."""
        with torch.no_grad():
            for name, t in model.state_dict().items():
                whole = weight_of(state, name, t)
                if hasattr(t, "to_local"):
                    t.to_local().copy_(self._my_rows([whole], t, name, name))
                else:
                    t.copy_(whole)

    def each_weight(self, model: nn.Module):
        """The state_dict an entry at a time, for model.pt: each sharded tensor gathered whole (every rank)
        and handed out, then dropped; so no process holds the whole model."""
        for name, t in model.state_dict().items():
            yield name, (t.full_tensor() if hasattr(t, "full_tensor") else t).detach()

    def sharded_state(self, model: nn.Module) -> tuple[dict, dict]:
        """(the state every rank holds whole: buffers; this rank's rows of every sharded tensor)."""
        whole, mine = {}, {}
        for name, t in model.state_dict().items():
            if hasattr(t, "to_local"):
                mine[name] = t.to_local().detach()
            else:
                whole[name] = t.detach()
        return whole, mine

    def load_sharded_state(self, model: nn.Module, whole: dict, mine: dict | None, everyone: list | None) -> None:
        """Back from sharded_state(): this rank's own rows, or at another world size its rows read from
        the old ranks that held them (`everyone`'s, mapped). ValueError where a tensor does not fit."""
        load_whole_part(model, whole)
        with torch.no_grad():
            for name, t in model.state_dict().items():
                if not hasattr(t, "to_local"):
                    continue
                if name not in (mine if mine is not None else everyone[0]):
                    raise ValueError(f"it holds no {name}")
                rows = mine[name] if mine is not None else self._my_rows([o[name] for o in everyone], t, name, name)
                if rows.shape != t.to_local().shape:
                    raise ValueError(f"its {name} is {list(rows.shape)} on this rank, this run's "
                                     f"{list(t.to_local().shape)}")
                t.to_local().copy_(rows)

    def optimizer_layout(self) -> list[dict] | None:
        return layout_of([[p] for group in self.param_groups() for p in group["params"]], self.model, "rows")

    def load_whole_optimizer_state(self, optimizer, by_name) -> None:
        """Whole state by parameter name (checkpoint/whole_state.py's, read a parameter at a time), cut to this
        rank's rows: of each state tensor only those rows are read."""
        names = param_names(self.model)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        state = {}
        for i, p in enumerate(params):
            state[i] = {key: (self._rows_of([value], p, key, i) if isinstance(value, torch.Tensor) and value.dim() > 0
                              else value.clone() if isinstance(value, torch.Tensor) else value)
                        for key, value in state_named(by_name, names[id(p)]).items()}
        optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})

    def reshard_optimizer_state(self, states: list[dict], optimizer) -> dict:
        """This rank's optimizer state from every rank's of a run at another world size: each state tensor's
        rows that this rank now holds (FSDP2 keeps rank r's chunk of dim 0, torch.chunk's, unpadded), read
        from the old ranks that held them (checkpoint/reshard.py's my_rows). ValueError where a tensor does
        not match its parameter."""
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if any(stepped(s) != len(params) for s in states):
            raise ValueError(f"the checkpoint's optimizer steps {stepped(states[0])} parameters, "
                             f"this run {len(params)}")
        state = {}
        for i, p in enumerate(params):
            state[i] = {}
            for name, value in states[0]["state"].get(i, {}).items():
                if not (isinstance(value, torch.Tensor) and value.dim() > 0):  # AdamW's step: every rank's
                    state[i][name] = unmapped(value)
                    continue
                state[i][name] = self._rows_of([local(s["state"][i][name]) for s in states], p, name, i)
        return {"state": state, "param_groups": states[0]["param_groups"]}

    def _rows_of(self, pieces: list[torch.Tensor], p, what: str, i):
        """This rank's rows of DTensor p from every old rank's rows of it (`pieces`), as a DTensor like p."""
        from torch.distributed.tensor import DTensor
        return DTensor.from_local(self._my_rows(pieces, p, what, i), p.device_mesh, p.placements, run_check=False,
                                  shape=p.shape, stride=p.stride())

    def _my_rows(self, pieces: list[torch.Tensor], p, what: str, i) -> torch.Tensor:
        """This rank's rows of DTensor p, from every old rank's rows of it (`pieces`, in rank order)."""
        rows = sum(t.shape[0] for t in pieces)
        if rows != p.shape[0] or any(t.shape[1:] != p.shape[1:] for t in pieces):
            raise ValueError(f"{what} of parameter {i} joins to {[rows, *pieces[0].shape[1:]]}, the parameter is "
                             f"{list(p.shape)}")
        mine = my_rows(lambda q: pieces[q], rows, len(pieces), self.shard_rank, self.shards_over)
        return mine.clone().to(local(p).device)

    def describe(self) -> str:
        hsdp = f" (HSDP: {self.replicas} islands of {self.shards_over})" if self.replicas > 1 else ""
        return f"fsdp/{self.cfg.algo}{'+overlap' if self.cfg.overlap else ''}{hsdp}"
