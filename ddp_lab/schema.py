"""The training config: every key's type, default, help and valid range, in one place.

Hydra composes conf/train.yaml on top of TrainConfig below, so it rejects
unknown keys, wrong types and values off a key's list itself (`trainer.amp=bf61`
-> "Invalid value 'bf61', expected one of [auto, bf16, fp16, off]"). The YAML
presets in conf/ (model=resnet18, data=synthetic, sync=ddp) state only what
differs from these defaults. `check(cfg)` then refuses a value out of its
range, on every rank, before any rank joins the process group. A key with a
fixed list is a `Choice`, a str Enum compared with plain strings ("bf16").
`python -m ddp_lab.schema` prints the reference (docs/configuration.md).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from ddp_lab.config import ConfigError


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
TRI_STATE = ("auto", "true", "false")  # a plain string: YAML would read true/false as booleans


def key(default: Any, help: str, *, at_least: float | None = None,
        ok: Callable[[Any], bool] | None = None, rule: str = "") -> Any:
    """A config key: its default, one line of help, and what check() accepts.

    at_least: the smallest value; ok/rule: any other test, and what it requires
    ("a positive, finite number"), said in the error line.
    """
    if at_least is not None:
        ok, rule = (lambda v, n=at_least: v >= n), rule or f">= {at_least:g}"
    meta = {"help": help, "ok": ok, "rule": rule}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def one_of(values: tuple[str, ...]) -> Callable[[Any], bool]:
    return lambda v: str(v).lower() in values


def non_empty(v) -> bool:
    return len(v) > 0


def positive_finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


@dataclass
class ModelConfig:
    _target_: str = key(MISSING, "the function that builds the model (set by each model preset)")
    name: str = key(MISSING, "label used in logs and summary.json")
    num_classes: int = key(10, "classes the model predicts (Fashion-MNIST: 10)", at_least=1)
    in_channels: int = key(1, "input channels (Fashion-MNIST: 1, grayscale)", at_least=1)
    init: Init = key(Init.default, "default (PyTorch's) | d2l (normal, std 0.01, as in the chapter)")
    sync_bn: bool = key(False, "BatchNorm as SyncBatchNorm: statistics over the global batch (GPU ranks only)")
    crop_unused_border: Optional[bool] = key(
        None, "lenet_fast: skip the input's last 2 rows/cols, which never reach the output (null: no such key)")
    pad_channels_to: Optional[int] = key(
        None, "lenet_fast, compiled on CPU under bf16: conv1's channels computed as this many (0: off)")


@dataclass
class DataConfig:
    name: DataName = key(DataName.fashion_mnist, "fashion_mnist | synthetic (deterministic random images)")
    batch_size: int = key(512, "GLOBAL batch, split evenly over the ranks (d2l: 256)", at_least=1,
                          rule="a positive global batch size")
    loader: Loader = key(Loader.device, "device: the whole split on the training device | dataloader: torch's")
    num_workers: int = key(0, "DataLoader worker processes per rank (loader=dataloader only)", at_least=0)
    normalize: bool = key(True, "scale pixels with mean and std (false: [0, 1], as d2l's ToTensor)")
    mean: float = key(0.2860, "pixel mean to subtract (Fashion-MNIST's training set)")
    std: float = key(0.3530, "pixel std to divide by (Fashion-MNIST's training set)", ok=positive_finite,
                     rule="a positive, finite number")
    root: Optional[str] = key(None, "folder with the four .gz IDX files, or a torchvision root; "
                                    "null: the Debian package's folder")
    download: bool = key(False, "let torchvision download the files when none are found locally")
    cache_dir: str = key("~/.cache/ddp_lab", "where the gzipped files are unpacked once for torchvision")
    image_shape: List[int] = key([1, 28, 28], "synthetic: [channels, height, width]")
    num_classes: int = key(10, "synthetic: labels drawn from 0..num_classes-1", at_least=1)
    num_train: int = key(60000, "synthetic: training images per epoch", at_least=1)
    num_test: int = key(10000, "synthetic: test images", at_least=1)


@dataclass
class OptimConfig:
    _target_: str = key("torch.optim.SGD", "the optimizer class (torch.optim.SGD)")
    lr: float = key(0.2, "peak learning rate for the global batch (0.1 per 256 images)", ok=positive_finite,
                    rule="a positive, finite number (e.g. optim.lr=0.1)")
    momentum: float = key(0.9, "0 gives d2l's plain SGD", at_least=0)
    weight_decay: float = key(0.0005, "L2 penalty", at_least=0)
    nesterov: bool = key(True, "Nesterov momentum (needs momentum > 0)")
    schedule: Schedule = key(Schedule.cosine, "constant | cosine (decays to 0 over the run)")
    warmup_epochs: float = key(0.5, "linear warm-up from about 0, in epochs (0: none)", at_least=0)


@dataclass
class SyncConfig:
    mode: SyncMode = key(SyncMode.auto, "when and in what pieces gradients travel: auto (flat on CPU, "
                                        "ddp on GPU) | ddp | flat | per_param")
    algo: Algo = key(Algo.builtin, "how a buffer is all-reduced: builtin (gloo/NCCL) or a hand-written "
                                   "one (ddp_lab.collectives)")
    bucket_cap_mb: float = key(25.0, "ddp: DDP's bucket size; flat: buffers of at most this size (0: one)",
                               at_least=0)
    gradient_as_bucket_view: bool = key(True, "ddp: gradients alias DDP's buckets (saves a copy)")
    static_graph: bool = key(False, "ddp: promise DDP the graph never changes")
    compress: Compress = key(Compress.none, "none | bf16 | fp16: all-reduce 16-bit gradients (half the bytes)")
    poll: str = key("false", "opt-in: CPU ranks wait for the builtin all-reduce by polling (auto: where the "
                             "ranks fill the cores exactly); paid on one CPU of three (docs/defaults.md)",
                    ok=one_of(TRI_STATE), rule="one of auto, true, false")


@dataclass
class TrainerConfig:
    epochs: int = key(10, "passes over the training set", at_least=1)
    max_steps: int = key(0, "stop after this many optimizer steps (0: no cap), for quick checks", at_least=0)
    log_every: int = key(50, "write the step's loss, lr and straggler times to TensorBoard every N steps",
                         at_least=1)
    warmup_steps: int = key(5, "steps left out of the throughput figures", at_least=0)
    eval_every: int = key(1, "evaluate every N epochs (the last always); 0: only at the end", at_least=0)
    amp: Amp = key(Amp.auto, "auto (bf16 where the hardware runs it fast) | bf16 | fp16 (CUDA) | off")
    channels_last: bool = key(True, "NHWC memory layout: faster convolutions with bf16")
    compile: str = key("auto", "torch.compile: auto (where each rank trains on 250,000+ images and inductor "
                               "can build kernels) | true | false", ok=one_of(TRI_STATE),
                       rule="one of auto, true, false")
    threads: int = key(0, "torch threads per rank (0: keep the default; torchrun sets 1)", at_least=0)
    grad_accum: int = key(1, "micro-batches per optimizer step (no communication between them)", at_least=1)
    progress: bool = key(True, "progress bar on rank 0 when attached to a terminal")
    ckpt_every: int = key(0, "also checkpoint every N optimizer steps (0: only at epoch ends)", at_least=0)
    keep_ckpts: int = key(2, "keep the newest N checkpoints in <run dir>/checkpoints (0: write none)",
                          at_least=0)
    resume: str = key("none", "none | auto (this run dir's newest checkpoint) | a step-N directory "
                              "(into a new run dir)")
    preempt_save_s: float = key(20.0, "on SIGTERM or SIGINT (SLURM, Kubernetes, torchrun, Ctrl-C): finish the "
                                      "step, save a checkpoint at it and exit 143 within this many seconds "
                                      "(0: stop at once, no save)", at_least=0)
    straggler_threshold: float = key(1.2, "name a rank whose compute per step is this many times the "
                                          "others' median", at_least=1)
    profile: bool = key(False, "write a torch.profiler Chrome trace per rank to <run dir>/profile/")
    profile_wait: int = key(5, "steps skipped before profiling (plus one warm-up step)", at_least=0)
    profile_active: int = key(3, "steps recorded in the trace", at_least=1)


@dataclass
class DistConfig:
    backend: Backend = key(Backend.auto, "auto (nccl on CUDA, gloo on CPU) | gloo | nccl")
    device: Device = key(Device.auto, "auto (cuda if available) | cpu | cuda (one GPU per rank, by LOCAL_RANK)")
    timeout_s: float = key(300.0, "a rank waiting longer than this (to join, in a collective) or making no "
                                  "progress (but for a first compile) names who is missing and stops",
                           ok=positive_finite, rule="a positive number of seconds")
    stall_warn_s: float = key(60.0, "training: a rank waiting longer than this in a collective logs who has "
                                    "not arrived (0: no warning)", at_least=0)
    comm_threads: CommThreads = key(CommThreads.normal, "opt-in: gloo's threads at real-time priority on CPU "
                                                        "ranks (realtime; auto: where the ranks fill every core); "
                                                        "paid on 2-core VMs whose ranks fill them (docs/defaults.md)")


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    seed: int = key(0, "model init (the same on every rank) and the sampler's shuffle seed")


GROUPS = {f.name: f.default_factory for f in dataclasses.fields(TrainConfig) if f.name != "seed"}


def register() -> None:
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)


def _nested(f) -> type | None:
    """The dataclass a field holds (a config group), or None for a plain key."""
    if f.default_factory is dataclasses.MISSING:
        return None
    value = f.default_factory()
    return type(value) if dataclasses.is_dataclass(value) else None


def _nodes(node: type, prefix: str = ""):
    """(prefix, dataclass) for node and every group nested in it, depth first."""
    yield prefix, node
    for f in dataclasses.fields(node):
        if (sub := _nested(f)) is not None:
            yield from _nodes(sub, f"{prefix}{f.name}.")


def check(cfg, node: type = TrainConfig) -> None:
    """Refuse the first value out of its key's range, with one line naming the key and the range."""
    for prefix, schema in _nodes(node):
        values = OmegaConf.select(cfg, prefix[:-1]) if prefix else cfg
        for f in dataclasses.fields(schema):
            ok = f.metadata.get("ok")
            value = values.get(f.name)
            if ok is not None and value is not None and not ok(value):
                shown = list(value) if OmegaConf.is_list(value) else value
                raise ConfigError(f"{prefix}{f.name}={shown} must be {f.metadata['rule']}")


def reference(node: type = TrainConfig, level: int = 3) -> str:
    """Every key of a config as markdown tables, one per group, under headings of `level`."""
    lines = []
    for prefix, schema in _nodes(node):
        keys = [f for f in dataclasses.fields(schema) if _nested(f) is None]
        if not keys:
            continue
        lines += [f"{'#' * level} {prefix[:-1] or 'top level'}", "", "| key | default | meaning |", "|---|---|---|"]
        for f in keys:
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            shown = "(the preset's)" if default == MISSING else f"`{_yaml(default)}`"
            rule = f" Must be {f.metadata['rule']}." if f.metadata.get("rule") else ""
            meaning = f"{f.metadata['help']}.{rule}".replace("|", "\\|")  # a table cell
            lines.append(f"| `{prefix}{f.name}` | {shown} | {meaning} |")
        lines.append("")
    return "\n".join(lines)


def _yaml(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    return str(value)


if __name__ == "__main__":
    print(reference(), end="")
