"""The optimizer and its learning-rate schedule, built from the optim config group."""
from __future__ import annotations

import math

import torch
from hydra.errors import InstantiationException

from ddp_lab.config import ConfigError, targets


def build_optimizer(cfg, params):
    """The optimizer `cfg._target_` (the optim group) names; the schedule keys are ddp_lab's own."""
    try:
        return targets.build("optim", cfg, params=params)
    except InstantiationException as e:
        # torch.optim checks its own arguments ("Invalid learning rate: -1.0"): pass that on
        if isinstance(e.__cause__, ValueError):
            raise ConfigError(f"optim: {cfg._target_} refused these settings: {e.__cause__} "
                              "(fix the optim.* value it names)") from None
        raise


def warmup_steps(cfg, steps_per_epoch: int) -> int:
    """optim.warmup_steps where set, else optim.warmup_epochs in steps."""
    return cfg.warmup_steps if cfg.warmup_steps > 0 else int(cfg.warmup_epochs * steps_per_epoch)


def build_schedule(optimizer, cfg, steps_per_epoch: int, total_steps: int):
    """Per-step learning-rate multiplier: linear warm-up, then constant or cosine decay."""
    warmup = warmup_steps(cfg, steps_per_epoch)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if cfg.schedule == "constant":
            return 1.0
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
