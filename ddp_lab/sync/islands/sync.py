"""IslandSync: sync/inner's every-step strategy inside each island, sync=<name>'s periodic one across them.

The inner strategy sees the island as its world (rank and world size counted within, its collectives on
the island's group): DDP's buckets or flat's buffer average the gradients over the island's K ranks every
step, so an island's ranks hold the same weights always. The periodic strategy sees rank `member` of every
island as its world and sends this rank's 1/K chunk of the outer gradient across (islands/layout.py);
every rank of an island then holds the same anchor and takes the same outer step. Where the inner strategy
shards the weights (zero stage 3, fsdp) it is built first, and the periodic one works on this rank's shards
(trained_shards): its outer gradient, anchor and outer momentum are of its shard, which crosses whole.

The Trainer's calls go to the one that acts at each point: the forward, backward and gradient sync to the
inner, the weight syncs, evaluation's consensus, finish and the checkpointed state to the outer; the
weights as saved and loaded (whole, or in shards) to the inner.
"""
from __future__ import annotations

import contextlib
import dataclasses

from torch import nn

from ddp_lab.config import RunFailed
from ddp_lab.distributed import DistEnv
from ddp_lab.sync.base import NO_CONTEXT, Capabilities, ReplicaSync, SyncContext, broadcast_from_rank0
from ddp_lab.sync.islands.layout import build_islands, replica_islands
from ddp_lab.sync.islands.replica_group import ReplicaGroup, fault_tolerant


def island_caps(inner: Capabilities) -> Capabilities:
    """What islands can do: the inner strategy's (its shards, its gradients' life), the islands apart between
    the outer syncs."""
    return dataclasses.replace(inner, diverges=True)


class IslandSync(ReplicaSync):

    def __init__(self, model: nn.Module, env: DistEnv, cfg, inner_cls: type, outer_cls: type,
                 ctx: SyncContext = NO_CONTEXT):
        self.model, self.env, self.cfg = model, env, cfg
        self.replicas = None
        if fault_tolerant(cfg):  # this job is the island; torchft's Manager finds the others (replica_group.py)
            self.replicas = ReplicaGroup(cfg, env.rank, env.world_size, 10 * cfg.island_timeout_s, ctx.identity)
            self.islands = replica_islands(cfg, env, self.replicas)
        else:
            self.islands = build_islands(cfg.islands, env)
        if ctx.init is None:  # (a meta-device build: every rank replays the same initialisation)
            broadcast_from_rank0(model)  # every island from rank 0's weights (DDP would start each from its own)
        # (zero lays optim.no_decay's parameters out in chunks of their own as it builds; stage 3 and fsdp build
        # from the meta device and gather in param_dtype)
        inner_ctx = dataclasses.replace(ctx, islands=None, trained=None)
        if inner_cls.caps.sharding == 3:  # the weights sharded inside: the outer strategy works on this rank's shards
            self.inner = inner_cls(model, self.islands.inside, cfg.inside(), inner_ctx)
            self.islands = dataclasses.replace(self.islands, sharded_inside=True)
            self.outer = outer_cls(model, self.islands.across, cfg, SyncContext(
                islands=self.islands, trained=self.inner.parameters if outer_cls.averages == "gradients"
                else self.inner.trained_shards))
        else:  # (ft_ddp averages the gradients of what the optimizer steps: zero's its shards of them)
            stepped = (lambda: self.inner.parameters()) if outer_cls.averages == "gradients" else None
            self.outer = outer_cls(model, self.islands.across, cfg, SyncContext(islands=self.islands, trained=stepped))
            self.inner = inner_cls(model, self.islands.inside, cfg.inside(), inner_ctx)
        self.module = self.inner.module
        self.comm_timing = self.inner.comm_timing
        self.caps = island_caps(self.inner.caps)
        self.shards_over = self.islands.size  # (sync.inner=zero: a copy of the optimizer state is cut K ways)

    def state_tensors(self) -> list:
        return self.inner.state_tensors() + self.outer.state_tensors()

    # what both count and time --------------------------------------------------------------------
    @property
    def measuring(self) -> bool:
        return self.inner.measuring

    @measuring.setter
    def measuring(self, value: bool) -> None:
        self.inner.measuring = self.outer.measuring = value

    @property
    def wire_bytes(self) -> int:
        return self.inner.wire_bytes + self.outer.wire_bytes

    @property
    def collectives(self) -> int:
        return self.inner.collectives + self.outer.collectives

    @property
    def wire_bytes_across(self) -> int:
        return self.outer.wire_bytes_across

    @property
    def collectives_across(self) -> int:
        return self.outer.collectives_across

    @property
    def comm_seconds(self) -> float:
        return self.inner.comm_seconds + self.outer.comm_seconds

    def counts(self) -> dict[str, int]:
        return {k: a + b for (k, a), b in zip(self.inner.counts().items(), self.outer.counts().values())}

    @contextlib.contextmanager
    def uncounted(self):
        with self.inner.uncounted(), self.outer.uncounted():
            yield

    # a step: the inner strategy ------------------------------------------------------------------
    @property
    def no_decay(self) -> frozenset:  # (build_sync sets it: the inner strategy's groups use it)
        return self.inner.no_decay

    @no_decay.setter
    def no_decay(self, names: frozenset) -> None:
        self.inner.no_decay = names

    def param_groups(self) -> list[dict]:
        return self.inner.param_groups()

    def parameters(self) -> list:
        return self.inner.parameters()

    def clip_grad_norm(self, max_norm: float):
        return self.inner.clip_grad_norm(max_norm)

    def no_sync(self):
        return self.inner.no_sync()

    def during_backward(self, last: bool):
        return self.inner.during_backward(last)

    def after_backward(self) -> None:
        self.inner.after_backward()
        self.outer.after_backward()  # (ft_ddp: the island's gradients across; the periodic ones: nothing)

    def agreed(self) -> bool:
        return self.outer.agreed()

    # the weights across islands: the outer strategy ----------------------------------------------
    def after_step(self, step: int) -> None:
        self.inner.after_step(step)
        self.outer.after_step(step)

    def synced_at(self, step: int) -> bool:
        return self.outer.synced_at(step)

    def finish(self, step: int) -> None:
        self.outer.finish(step)

    # the weights and the optimizer state as the inner strategy holds them ---------------------------
    def whole_weights(self):
        return self.inner.whole_weights()

    def model_state_dict(self, model: nn.Module) -> dict:
        return self.inner.model_state_dict(model)

    def load_model_state_dict(self, model: nn.Module, state: dict) -> None:
        self.inner.load_model_state_dict(model, state)

    def reshard_optimizer_state(self, states: list[dict], optimizer) -> dict:
        """sync.inner=zero at another world size: this rank's chunks, cut from island 0's (`states`)."""
        return self.inner.reshard_optimizer_state(states, optimizer)

    def each_weight(self, model: nn.Module):
        return self.inner.each_weight(model)

    def state_layout(self, model: nn.Module) -> dict:
        return self.inner.state_layout(model)

    def sharded_state(self, model: nn.Module) -> tuple[dict, dict]:
        return self.inner.sharded_state(model)

    def load_sharded_state(self, model: nn.Module, whole: dict, mine: dict | None, everyone: list | None) -> None:
        """(at another world size `everyone` holds island 0's shards: checkpoint/reshard.py)"""
        self.inner.load_sharded_state(model, whole, mine, everyone)

    @contextlib.contextmanager
    def consensus(self):
        with self.outer.consensus(), self.inner.consensus():  # (stage 3: the evaluation's gathers uncounted)
            yield

    def state_dict(self) -> dict:
        return {**self.outer.state_dict(), "islands": [self.islands.count, self.islands.size],
                **({"inner": inner} if (inner := self.inner.state_dict()) else {}),
                **({"replicas": self.replicas.state_dict()} if self.replicas is not None else {})}

    def own_state_dict(self) -> dict:
        return self.outer.own_state_dict()

    def load_state_dict(self, shared: dict, own: dict | None) -> None:
        if shared.get("islands", [self.islands.count, self.islands.size]) != [self.islands.count, self.islands.size]:
            own = None  # (another layout: each rank's in-flight chunks and residuals are another rank's)
        self.outer.load_state_dict(shared, own)
        if self.replicas is not None:
            self.replicas.load_state_dict(shared.get("replicas", {}))
        if "inner" in shared:
            self.inner.load_state_dict(shared["inner"], None)

    # sync.fault_tolerance=torchft: the islands present, a joiner healed from a peer ------------------
    def join(self, send, take, step: int) -> dict | None:
        return None if self.replicas is None else self.replicas.join(send, take, step)

    def counted(self, step: int) -> None:
        if self.replicas is not None and self.outer.quorum_due(step):  # the next round's islands
            healed = self.replicas.start_round(step)
            if healed is not None and healed["step"] != step:  # (islands step in lockstep: the data position holds)
                raise RunFailed(f"island {self.replicas.island} fell behind the others (its step {step}, theirs "
                                f"{healed['step']}: cut off from them?): stopping; started again (torchrun "
                                "--max-restarts, `cluster rejoin`) it rejoins from a peer")

    def summary_fields(self) -> dict:
        if self.replicas is None:
            return {}
        r = self.replicas
        return {"island": r.island, "membership": r.membership, "rounds_dropped": r.rounds_dropped}

    def scalars(self) -> dict[str, float]:
        return {} if self.replicas is None else {"islands/present": self.replicas.present}

    def close(self) -> None:
        if self.replicas is not None:
            self.replicas.close()

    def describe(self) -> str:
        return f"islands({self.islands.describe()}: {self.inner.describe()} inside, {self.outer.describe()} across)"
