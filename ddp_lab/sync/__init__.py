"""How the replicas agree: the sync strategies, by family. The one-page map:

    base.py          ReplicaSync: what the Trainer calls, a no-op for one process; Capabilities:
                     what a strategy lets the Trainer, the checkpoint and the guards rely on
    every_step/      the mean of the gradients every step, so the weights never differ
        ddp.py         torch's DistributedDataParallel (buckets overlap the backward; powersgd.py's hook)
        flat.py        one all-reduce of one flat buffer after the backward (the CPU default)
        per_param.py   one all-reduce per parameter (d2l's chapter)
    periodic/        the weights (or their change) every sync.every steps, apart in between
        local_sgd.py   averaged weights (post-local SGD)
        diloco.py      averaged change, applied by an outer Nesterov SGD; int8/int4, overlap (delayed or
                       eager), fragments
    islands/         every step inside an island of ranks (sync.inner: ddp, flat, zero, fsdp), a periodic
                     strategy across them; sync.mode=fsdp with islands is HSDP (sharded/fsdp.py)
        layout.py      the groups inside and across; the mean over islands, a chunk per rank
        sync.py        IslandSync: the two, composed
    sharded/         the model state cut N ways, each rank stepping its own shard (docs/memory.md)
        zero1.py       ZeRO stage 1 (optimizer state), the base of
        zero2.py       stage 2 (and the gradients), the base of
        zero3.py       stage 3 (and the weights, gathered a unit at a time)
        fsdp.py        torch's FSDP2 on the same units

The Trainer's calls, in a step's order: `sync.module(x)` for the forward, `during_backward()` around
each micro-batch, `after_backward()` before the optimizer step, `after_step()` where weights travel
(periodic, stage 1-2's all-gather); `consensus()` around an evaluation, `finish()` at the end.

The keys (conf/sync/, ddp_lab/config/schema.py): sync.mode picks the strategy (auto: flat on CPU
ranks, ddp on GPU ranks); sync.algo how a buffer is reduced (builtin: gloo or NCCL; or one of
ddp_lab.collectives' algorithms written on send and receive); sync.compress what crosses the wire
(bf16/fp16 casts, powersgd under DDP, int8/int4 for DiLoCo). Every strategy counts the bytes it
hands to collectives (`wire_bytes`), and reports its communication time as base.py explains.

A new strategy: a class in its family's folder, its family's STRATEGIES entry and rules (validate),
its name in schema.SyncMode. docs/bandwidth.md compares them all.
"""
from __future__ import annotations

import inspect
from types import SimpleNamespace

import torch
from torch import nn

from ddp_lab.collectives import ALGORITHMS
from ddp_lab.collectives.quantized import BITS as QUANTIZED
from ddp_lab.distributed import DistEnv
from ddp_lab.sync import every_step, islands, periodic, sharded
from ddp_lab.sync.base import Capabilities, ReplicaSync
from ddp_lab.sync.every_step.averaging import COMPRESS_DTYPES
from ddp_lab.sync.islands.sync import IslandSync, island_caps

FAMILIES = (every_step, periodic, sharded, islands)  # (islands: the rules of sync.islands and sync.inner)
MODES = tuple(every_step.STRATEGIES)  # the modes that average every step's gradients
PERIODIC = tuple(periodic.STRATEGIES)  # the modes that send weights every sync.every steps
SHARDED = tuple(sharded.STRATEGIES)  # the modes that shard the model state over the ranks
REGISTRY = {**every_step.STRATEGIES, **periodic.STRATEGIES, **sharded.STRATEGIES}  # mode -> class (or cfg -> class)
ALGOS = tuple(ALGORITHMS)  # builtin, naive, ring, halving_doubling, ring_textbook, halving_doubling_textbook, direct
COMPRESS = (*COMPRESS_DTYPES, "powersgd", *QUANTIZED)  # none, bf16, fp16, powersgd, int8, int4

__all__ = ["ALGOS", "COMPRESS", "Capabilities", "MODES", "PERIODIC", "REGISTRY", "ReplicaSync", "SHARDED",
           "build_sync", "capabilities", "eager_only", "inner_strategy", "resolve_mode", "resolved_mode", "strategy",
           "validate"]


def resolve_mode(mode: str, device: torch.device) -> str:
    """sync.mode=auto: flat on CPU ranks, ddp on GPU ranks.

    On CPU, LeNet on 2 ranks trained 3-14% faster with flat than with ddp in
    each of 12 alternating pairs of runs on the 2-core development machine
    (both polling): a small model's gradients fit one DDP bucket, so DDP has
    no overlap to offer, only its bookkeeping. On GPUs DDP's buckets overlap
    the allreduce with the backward, which is what larger models need.
    """
    if mode != "auto":
        return mode
    return "ddp" if device.type == "cuda" else "flat"


def resolved_mode(cfg, device: torch.device) -> str:
    """resolve_mode, but compress=powersgd needs DDP's hook: auto is ddp then."""
    return "ddp" if cfg.mode == "auto" and cfg.compress == "powersgd" else resolve_mode(cfg.mode, device)


def validate(cfg) -> None:
    """Refuse what the schema cannot see alone (identically on every rank, before any traffic):
    each family's rules, in turn."""
    for family in FAMILIES:
        family.validate(cfg)


def strategy(cfg, device: torch.device) -> type[ReplicaSync]:
    """The class sync.mode (and sync.zero_stage) name, on this device."""
    found = REGISTRY[resolved_mode(cfg, device)]
    return found if isinstance(found, type) else found(cfg)


def inner_strategy(cfg) -> type[ReplicaSync]:
    """The class sync.inner names (islands: the every-step strategy inside each)."""
    found = REGISTRY[cfg.inner]
    return found if isinstance(found, type) else found(cfg)


def capabilities(cfg, device: torch.device) -> Capabilities:
    """What the strategy the config names can do, known before it is built (islands: the inner one's)."""
    if islands.across_islands(cfg):
        return island_caps(inner_strategy(cfg).caps)
    return strategy(cfg, device).caps


def eager_only(cfg, device: torch.device | None = None) -> str:
    """Why the model must run eagerly under this sync ("" where it need not)."""
    return capabilities(cfg, device or torch.device("cpu")).eager


def build_sync(cfg, model: nn.Module, env: DistEnv, init=None, no_decay: frozenset = frozenset(),
               param_dtype: torch.dtype | None = None) -> ReplicaSync:
    """The strategy, built around `model`; `init` (models/meta_init.py's MetaInit): the model is on the
    meta device, and a strategy that shards the weights makes them a unit at a time; `no_decay`: the
    names of the parameters optim.no_decay steps without weight decay (zero lays their chunks apart);
    `param_dtype` (bf16 under trainer.amp=bf16): where the sync gathers the weights (stage 3, fsdp), it
    gathers them in it, the optimizer stepping the shards in their own."""
    validate(cfg)
    if not env.distributed:
        sync = ReplicaSync(model, env)
    else:
        mode = resolved_mode(cfg, env.device)
        if mode != cfg.mode:  # the strategies read cfg.mode (describe() reports it)
            items = vars(cfg) if isinstance(cfg, SimpleNamespace) else dict(cfg)
            cfg = SimpleNamespace(**{**items, "mode": mode})
        cls = strategy(cfg, env.device)
        if islands.across_islands(cfg):
            sync = IslandSync(model, env, cfg, inner_strategy(cfg), cls, no_decay, init, param_dtype)
            sync.no_decay = no_decay
            return sync
        extra = {"init": init} if init is not None else {}
        takes = inspect.signature(cls).parameters
        if no_decay and "no_decay" in takes:
            extra["no_decay"] = no_decay
        if param_dtype is not None and "param_dtype" in takes:
            extra["param_dtype"] = param_dtype
        sync = cls(model, env, cfg, **extra)
    sync.no_decay = no_decay
    return sync
