"""Gradient synchronisation strategies: how every rank ends a step with the same gradient.

`build_sync(cfg.sync, model, env)` returns a GradSync. The trainer only ever
calls `sync.module(x)` for the forward pass, `sync.no_sync()` around
micro-batches that must not communicate, and `sync.after_backward()` before
the optimizer step.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_lab.config import ConfigError
from ddp_lab.distributed import DistEnv

MODES = ("ddp",)
ALGOS = ("builtin",)
COMPRESS = ("none",)


class GradSync:
    """No communication at all: a single process, or the base of the others."""

    def __init__(self, model: nn.Module, env: DistEnv):
        self.model = model
        self.module: nn.Module = model
        self.env = env
        self.comm_seconds = 0.0  # time inside gradient communication, summed over steps

    def no_sync(self):
        return contextlib.nullcontext()

    def after_backward(self) -> None:
        pass

    def describe(self) -> str:
        return "none"


class DDPSync(GradSync):
    """torch DistributedDataParallel: bucketed allreduce overlapped with backward."""

    def __init__(self, model: nn.Module, env: DistEnv, cfg):
        super().__init__(model, env)
        self.module = DDP(
            model,
            device_ids=[env.device.index] if env.device.type == "cuda" else None,
            bucket_cap_mb=cfg.bucket_cap_mb,
            gradient_as_bucket_view=cfg.gradient_as_bucket_view,
            static_graph=cfg.static_graph,
        )

    def no_sync(self):
        return self.module.no_sync()

    def describe(self) -> str:
        return "ddp/builtin"


def validate(cfg) -> None:
    """Reject unknown choices before any process group traffic (identically on every rank)."""
    for key, value, choices in (("sync.mode", cfg.mode, MODES), ("sync.algo", cfg.algo, ALGOS),
                                ("sync.compress", cfg.compress, COMPRESS)):
        if value not in choices:
            raise ConfigError(f"{key}={value!r} is not one of {', '.join(choices)}")
    if cfg.bucket_cap_mb <= 0:
        raise ConfigError(f"sync.bucket_cap_mb={cfg.bucket_cap_mb} must be > 0")


def build_sync(cfg, model: nn.Module, env: DistEnv) -> GradSync:
    validate(cfg)
    if not env.distributed:
        return GradSync(model, env)
    return DDPSync(model, env, cfg)
