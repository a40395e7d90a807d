"""How the replicas agree: the sync strategies, by family. The one-page map:

    registry.py      the strategies by name: `sync=<name>` picks one, typed by its options (the dataclass of
                     its keys, beside its class); the one list a new strategy joins
    options.py       the keys every strategy takes (sync.algo, the units, sync.poll)
    base.py          ReplicaSync: what the Trainer calls, a no-op for one process; Capabilities: what a
                     strategy lets the Trainer, the checkpoint and the guards rely on; SyncContext: what the
                     builder hands every strategy besides its options
    every_step/      the mean of the gradients every step, so the weights never differ
        ddp.py         torch's DistributedDataParallel (buckets overlap the backward); powersgd under it
        flat.py        one all-reduce of one flat buffer after the backward (the CPU default, auto.py)
        per_param.py   one all-reduce per parameter (d2l's chapter)
    periodic/        the weights (or their change) every sync.every steps, apart in between
        local_sgd.py   averaged weights (post-local SGD)
        diloco.py      averaged change, applied by an outer Nesterov SGD; int8/int4, overlap (delayed or
                       eager), fragments
    islands/         every step inside an island of ranks (sync/inner=ddp, flat, zero, fsdp), a periodic
                     strategy across them; sync=fsdp with islands is HSDP (sharded/fsdp.py)
    sharded/         the model state cut N ways, each rank stepping its own shard (docs/memory.md):
                     zero1.py, zero2.py, zero3.py (ZeRO's stages), fsdp.py (torch's FSDP2)

The Trainer's calls, in a step's order: `sync.module(x)` for the forward, `during_backward()` around
each micro-batch, `after_backward()` before the optimizer step, `after_step()` where weights travel
(periodic, stage 1-2's all-gather); `consensus()` around an evaluation, `finish()` at the end.

A new strategy: a class taking (model, env, options, ctx), its options dataclass deriving from SyncOptions
(keys, defaults, help, ranges; `check()` for rules between them), and one `register(name, Options, Class)`
call; `sync=<name>` then works, and the configuration reference lists its keys. docs/bandwidth.md compares
the strategies.
"""
from __future__ import annotations

import torch
from torch import nn

from ddp_lab.distributed import DistEnv
from ddp_lab.sync import every_step, periodic, sharded  # noqa: F401  (each registers its strategies)
from ddp_lab.sync.base import NO_CONTEXT, Capabilities, ReplicaSync, SyncContext
from ddp_lab.sync.islands import across_islands
from ddp_lab.sync.islands.sync import IslandSync, island_caps
from ddp_lab.sync.options import SyncOptions
from ddp_lab.sync.registry import CPU, REGISTRY, check, name_of, options_of, register, resolved, strategy_class

__all__ = ["Capabilities", "REGISTRY", "ReplicaSync", "SyncContext", "SyncOptions", "build_sync", "capabilities",
           "every_step_options",
           "check", "eager_only", "name_of", "options_of", "register", "resolved", "strategy_class"]


def capabilities(opts: SyncOptions, device: torch.device = CPU) -> Capabilities:
    """What the strategy of these options can do, known before it is built (islands: the inner one's)."""
    if across_islands(opts):
        return island_caps(strategy_class(opts.inside(), device).caps)
    return strategy_class(opts, device).caps


def eager_only(opts: SyncOptions, device: torch.device | None = None) -> str:
    """Why the model must run eagerly under this sync ("" where it need not)."""
    return capabilities(opts, device or CPU).eager


def build_sync(opts, model: nn.Module, env: DistEnv, ctx: SyncContext = NO_CONTEXT) -> ReplicaSync:
    """The strategy, built around `model` (opts: its options, or the sync group Hydra composed); `ctx.init`
    (models/meta_init.py's MetaInit): the model is on the meta device, and a strategy that shards the weights
    makes them a unit at a time; `ctx.no_decay`: the names of the parameters optim.no_decay steps without
    weight decay; `ctx.param_dtype` (bf16 under trainer.amp=bf16): where the sync gathers the weights (stage 3,
    fsdp), it gathers them in it, the optimizer stepping the shards in their own."""
    opts = options_of(opts)
    check(opts)
    if not env.distributed:
        sync = ReplicaSync(model, env)
    else:
        opts = resolved(opts, env.device)
        cls = strategy_class(opts, env.device)
        if across_islands(opts):
            sync = IslandSync(model, env, opts, strategy_class(opts.inside(), env.device), cls, ctx)
        else:
            sync = cls(model, env, opts, ctx)
    sync.no_decay = ctx.no_decay
    return sync


def every_step_options(opts: SyncOptions) -> SyncOptions:
    """The options of the strategy that runs every step (whose units stage 3, fsdp and activation checkpointing
    use): the one inside islands, else these."""
    return opts.inside() if across_islands(opts) else opts
