"""Typed schema of the training config.

The values and their comments live in conf/*.yaml; this file only gives each
key a type, so Hydra itself rejects unknown keys, wrong types and values off
a key's list when it composes the config (`trainer.epochs=ten` -> "Value
'ten' of type 'str' could not be converted to Integer"; `trainer.amp=bf61` ->
"Invalid value 'bf61', expected one of [auto, bf16, fp16, off]"). MISSING
means "the YAML must set it".

A key with a fixed list of values is a `Choice`: a str Enum, so the code
compares it with plain strings ("bf16") and prints it as one. Two tri-state
keys stay plain strings checked where they are used (trainer.compile,
sync.poll: auto | true | false), because YAML reads `true` as a boolean.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import List, Optional


class Choice(str, Enum):
    """A config value from a fixed list, equal to (and printed as) its name."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


def choices(name: str, values: str) -> type[Choice]:
    return Choice(name, [(v, v) for v in values.split()])


Init = choices("Init", "default d2l")
DataName = choices("DataName", "fashion_mnist synthetic")
Loader = choices("Loader", "device dataloader")
Schedule = choices("Schedule", "constant cosine")
SyncMode = choices("SyncMode", "auto ddp flat per_param")
Algo = choices("Algo", "builtin naive ring halving_doubling ring_textbook halving_doubling_textbook")
Compress = choices("Compress", "none bf16 fp16")
Amp = choices("Amp", "auto bf16 fp16 off")
Backend = choices("Backend", "auto gloo nccl")
Device = choices("Device", "auto cpu cuda")
CommThreads = choices("CommThreads", "auto realtime normal")

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class ModelConfig:
    _target_: str = MISSING
    name: str = MISSING
    num_classes: int = MISSING
    in_channels: int = MISSING
    init: Init = MISSING
    sync_bn: bool = MISSING
    crop_unused_border: Optional[bool] = None  # lenet_fast only; None: the model has no such key
    pad_channels_to: Optional[int] = None  # lenet_fast only, as above


@dataclass
class DataConfig:
    name: DataName = MISSING
    batch_size: int = MISSING
    loader: Loader = MISSING
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
    schedule: Schedule = MISSING
    warmup_epochs: float = MISSING


@dataclass
class SyncConfig:
    mode: SyncMode = MISSING
    algo: Algo = MISSING
    bucket_cap_mb: float = MISSING
    gradient_as_bucket_view: bool = MISSING
    static_graph: bool = MISSING
    compress: Compress = MISSING
    poll: str = MISSING  # auto | true | false


@dataclass
class TrainerConfig:
    epochs: int = MISSING
    max_steps: int = MISSING
    log_every: int = MISSING
    warmup_steps: int = MISSING
    eval_every: int = MISSING
    amp: Amp = MISSING
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
    backend: Backend = MISSING
    device: Device = MISSING
    timeout_s: float = MISSING
    stall_warn_s: float = 60.0
    comm_threads: CommThreads = CommThreads.normal


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
