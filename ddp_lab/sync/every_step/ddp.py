"""sync=ddp: torch DistributedDataParallel, with our algorithms as its communication hook; sync=powersgd: torch's
PowerSGD hook under it (powersgd.py)."""
from __future__ import annotations

import logging
import sys
import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_lab.config import ConfigError
from ddp_lab.config.keys import key
from ddp_lab.distributed import DistEnv
from ddp_lab.sync.base import NO_CONTEXT, Capabilities, SyncContext, polls
from ddp_lab.sync.every_step.averaging import AveragingOptions, AveragingSync
from ddp_lab.sync.every_step.powersgd import PowerSGD
from ddp_lab.tuning import wait_polling

# DDP's first bucket, kept small so that the first allreduce starts early.
DDP_FIRST_BUCKET_BYTES = getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 1024 * 1024)

log = logging.getLogger("ddp_lab")


@dataclass
class DDPOptions(AveragingOptions):
    bucket_cap_mb: float = key(25.0, "DDP's buckets: gradients all-reduced in buckets of at most this many MB, each "
                                     "as soon as the backward fills it", ok=lambda v: v > 0, rule="> 0")
    gradient_as_bucket_view: bool = key(True, "gradients alias DDP's buckets (saves a copy)")
    static_graph: bool = key(False, "promise DDP the graph never changes")


@dataclass
class PowerSGDOptions(DDPOptions):
    powersgd_rank: int = key(2, "the rank of each gradient matrix's approximation (PowerSGD's paper matched full "
                                "accuracy at 2)", at_least=1)
    powersgd_start_step: int = key(100, "plain all-reduce for this many first steps, where inaccurate gradients "
                                        "hurt most", at_least=2)

    def check(self, name: str) -> None:
        self.refuse_algo(name, ("builtin",), "cannot run inside torch's PowerSGD hook")
        if self.compress != "none":
            raise ConfigError(f"sync.compress={self.compress}: sync=powersgd sends low-rank factors of its own; "
                              f"leave sync.compress out, or use sync=ddp sync.compress={self.compress}")


class DDPSync(AveragingSync):
    """torch DistributedDataParallel: bucketed allreduce overlapped with backward.

    algo=builtin leaves the reduction to torch's hooks: DDP's all-reduce, the
    bf16/fp16 compress hooks, PowerSGD (powersgd.py), each counting its bytes
    first; any other algo runs in a communication hook on each bucket,
    synchronously, and hands DDP a completed future.
    """

    caps = Capabilities(syncs_in_backward=True)
    name = "ddp"

    def __init__(self, model: nn.Module, env: DistEnv, cfg: DDPOptions, ctx: SyncContext = NO_CONTEXT):
        super().__init__(model, env, cfg)
        if _is_compiled(model) and cfg.bucket_cap_mb * 2**20 < DDP_FIRST_BUCKET_BYTES:
            _compile_whole_graph_under_ddp(cfg.bucket_cap_mb)
        self.module = DDP(
            model,
            device_ids=[env.device.index] if env.device.type == "cuda" else None,
            process_group=env.group,  # (None: the world; sync.islands: this island's ranks)
            bucket_cap_mb=cfg.bucket_cap_mb,
            gradient_as_bucket_view=cfg.gradient_as_bucket_view,
            static_graph=cfg.static_graph,
        )
        self.powersgd = None
        # The hooks hold this object weakly: DDP's reducer (C++) holds its hook, and a hook
        # holding `self` closes a cycle gc cannot see, so DDP and its process group would
        # outlive Trainer.close() and the group's teardown, until the interpreter's exit.
        me = weakref.proxy(self)
        if cfg.algo == "builtin":
            self.comm_timing = "unmeasured"
            hook = _counting(me, default_hooks.allreduce_hook)  # DDP's own all-reduce, its bytes counted
            if isinstance(cfg, PowerSGDOptions):
                self.powersgd = PowerSGD(cfg, list(self.module.parameters()),
                                         lambda nbytes, calls: me.count(nbytes, calls), wait=env.backend == "gloo")
                hook = self.powersgd.hook
            elif cfg.compress != "none":
                hook = _counting(me, {"bf16": default_hooks.bf16_compress_hook,
                                      "fp16": default_hooks.fp16_compress_hook}[cfg.compress], 2)
            if polls(cfg, env):
                hook = polling_hook(hook)
            self.module.register_comm_hook(env.group, hook)  # (torch's hooks take the group as their state)
        else:
            self.comm_timing = "hook"
            self.module.register_comm_hook(None, lambda state, bucket: me._hook(state, bucket))

    def state_dict(self) -> dict:
        return {"powersgd": self.powersgd.state_dict()} if self.powersgd else {}

    def own_state_dict(self) -> dict:
        return {"powersgd": self.powersgd.own_state_dict()} if self.powersgd else {}

    def load_state_dict(self, shared: dict, own: dict | None) -> None:
        if self.powersgd and "powersgd" in shared:
            self.powersgd.load_state_dict(shared["powersgd"], own["powersgd"] if own else None)

    def describe(self) -> str:
        if self.powersgd is None:
            return super().describe()
        return f"ddp/builtin+powersgd(rank {self.cfg.powersgd_rank})"

    def _hook(self, state, bucket):  # (no annotations: DDP checks them, and they are strings here)
        buffer = bucket.buffer()
        with self._timed():
            self._average(buffer)
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(buffer)
        return fut

    def no_sync(self):
        return self.module.no_sync()


def _counting(sync: DDPSync, torch_hook, wire_size: int | None = None):
    """torch_hook, first counting the bucket's bytes into `sync` (`wire_size` bytes per
    element if it compresses); it never waits."""
    def hook(state, bucket):
        buffer = bucket.buffer()
        sync.count(buffer.numel() * (wire_size or buffer.element_size()))
        return torch_hook(state, bucket)
    return hook


def polling_hook(hook):
    """A DDP comm hook that waits for the backward's last bucket by polling.

    DDP waits for every bucket's future when the backward ends; the last
    bucket is the one still in flight then, so polling it is where the wait is.
    """
    def polling(state, bucket):
        fut = hook(state, bucket)
        if bucket.is_last():
            wait_polling(fut.done)
        return fut
    return polling


def _is_compiled(model: nn.Module) -> bool:
    # No torch.compile without torch._dynamo loaded: do not pay for importing it here.
    dynamo = sys.modules.get("torch._dynamo")
    return dynamo is not None and isinstance(model, dynamo.eval_frame.OptimizedModule)


def _compile_whole_graph_under_ddp(bucket_cap_mb: float) -> None:
    """Let a compiled model train under DDP buckets smaller than DDP's first one.

    torch.compile cuts the model's graph at DDP's bucket boundaries, so that each
    bucket's allreduce starts while the rest of the backward runs; that pass
    (torch._dynamo.config.optimize_ddp) assumes no bucket is smaller than DDP's
    first (1 MiB) and fails with "First bucket should be smaller/equal to other
    buckets" when one is. Compiling the whole graph instead is correct; the
    price is that every bucket's allreduce starts after the backward ends.
    The setting is process-wide: one training run per process.
    """
    log.warning("sync.bucket_cap_mb=%s is below DDP's first bucket (%s MiB), which the "
                "compiled model's bucket-wise graph splitting cannot handle: compiling the "
                "whole graph, so allreduces start after the backward instead of during it. "
                "For overlap, use sync.bucket_cap_mb>=%s or trainer.compile=false.",
                bucket_cap_mb, DDP_FIRST_BUCKET_BYTES / 2**20, DDP_FIRST_BUCKET_BYTES / 2**20)
    torch._dynamo.config.optimize_ddp = False
