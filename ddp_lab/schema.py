"""Typed schema of the training config.

The values and their comments live in conf/*.yaml; this file only gives each
key a type, so Hydra itself rejects unknown keys and wrong types at start
(`trainer.epochs=ten` -> "Value 'ten' of type 'str' could not be converted to
Integer"). MISSING means "the YAML must set it".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class ModelConfig:
    _target_: str = MISSING
    name: str = MISSING
    num_classes: int = MISSING
    in_channels: int = MISSING
    init: str = MISSING
    sync_bn: bool = MISSING
    crop_unused_border: Optional[bool] = None  # lenet_fast only; None: the model has no such key
    pad_channels_to: Optional[int] = None  # lenet_fast only, as above


@dataclass
class DataConfig:
    name: str = MISSING
    batch_size: int = MISSING
    loader: str = MISSING
    num_workers: int = MISSING
    normalize: bool = MISSING
    mean: float = MISSING
    std: float = MISSING
    root: Optional[str] = None
    download: bool = False
    cache_dir: str = "~/.cache/ddp_lab"
    # synthetic only
    image_shape: List[int] = field(default_factory=lambda: [1, 28, 28])
    num_classes: int = 10
    num_train: int = 60000
    num_test: int = 10000


@dataclass
class OptimConfig:
    _target_: str = MISSING
    lr: float = MISSING
    momentum: float = MISSING
    weight_decay: float = MISSING
    nesterov: bool = MISSING
    schedule: str = MISSING
    warmup_epochs: float = MISSING


@dataclass
class SyncConfig:
    mode: str = MISSING
    algo: str = MISSING
    bucket_cap_mb: float = MISSING
    gradient_as_bucket_view: bool = MISSING
    static_graph: bool = MISSING
    compress: str = MISSING
    poll: str = MISSING  # auto | true | false


@dataclass
class TrainerConfig:
    epochs: int = MISSING
    max_steps: int = MISSING
    log_every: int = MISSING
    warmup_steps: int = MISSING
    eval_every: int = MISSING
    amp: str = MISSING
    channels_last: bool = MISSING
    compile: str = MISSING  # auto | true | false
    threads: int = MISSING
    grad_accum: int = MISSING
    progress: bool = MISSING
    profile: bool = MISSING
    profile_wait: int = MISSING
    profile_active: int = MISSING
    ckpt_every: int = MISSING
    keep_ckpts: int = MISSING
    resume: str = MISSING
    straggler_threshold: float = 1.2


@dataclass
class DistConfig:
    backend: str = MISSING
    device: str = MISSING
    timeout_s: float = MISSING
    stall_warn_s: float = 60.0
    comm_threads: str = "auto"  # auto | realtime | normal


@dataclass
class TrainConfig:
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    optim: OptimConfig = MISSING
    sync: SyncConfig = MISSING
    trainer: TrainerConfig = MISSING
    dist: DistConfig = MISSING
    seed: int = MISSING


def register() -> None:
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)


def check_trainer(t) -> None:
    """The trainer's counts must be in range (the schema only checks their types)."""
    from ddp_lab.config import ConfigError

    for key in ("epochs", "log_every", "grad_accum"):
        if t[key] < 1:
            raise ConfigError(f"trainer.{key}={t[key]} must be >= 1")
    for key in ("ckpt_every", "keep_ckpts", "max_steps", "warmup_steps", "eval_every", "threads"):
        if t[key] < 0:
            raise ConfigError(f"trainer.{key}={t[key]} must be >= 0")
