"""The model, data and optim groups: what ddp_lab reads from each, and the typed
settings of the presets it ships.

A group names a callable with `_target_`; every other key is the callable's
keyword argument, but the few ddp_lab reads itself (`BASES`: a model's `name`,
the data's `batch_size`, `loader`, `num_workers`, `task`; the optimizer's
schedule). A user's own preset (a YAML file in `--config-dir`) is an open
dict: its keys are passed on as the YAML types them, and ddp_lab's own keys
are checked against the base dataclass here. A shipped preset starts from one
of the dataclasses below (`defaults: [schema_<name>]`), so Hydra checks every
key's type and name, and check() every value's range.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from enum import Enum
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from ddp_lab.config.keys import choices, fraction, key, one_of, positive_finite

Init = choices("Init", "default d2l")
Loader = choices("Loader", "auto device dataloader")
Task = choices("Task", "auto classification language_model regression")
Schedule = choices("Schedule", "constant cosine")


# ---------------------------------------------------------------- model
@dataclass
class ModelConfig:
    _target_: str = key(MISSING, "the callable that returns the nn.Module (a preset's, or any importable one)")
    name: Optional[str] = key(None, "label used in logs and summary.json (null: the callable's name)")
    pretrained: str = key("", "weights to start from: a safetensors file, a save_pretrained directory (one file "
                              "or sharded) or a torch state_dict file (empty: the model's own initialisation)")


@dataclass
class ImageModelConfig(ModelConfig):
    num_classes: int = key(10, "classes the model predicts (Fashion-MNIST: 10)", at_least=1)
    in_channels: int = key(1, "input channels (Fashion-MNIST: 1, grayscale)", at_least=1)
    init: Init = key(Init.default, "default (PyTorch's) | d2l (normal, std 0.01, as in the chapter)")
    sync_bn: bool = key(False, "BatchNorm as SyncBatchNorm: statistics over the global batch (GPU ranks only)")


@dataclass
class LeNetFastConfig(ImageModelConfig):
    crop_unused_border: bool = key(True, "skip the input's last 2 rows/cols, which never reach the output")
    pad_channels_to: int = key(32, "compiled on CPU under bf16: conv1's channels computed as this many (0: off)",
                               at_least=0)


@dataclass
class GPTConfig(ModelConfig):
    vocab_size: int = key(256, "tokens the model reads and predicts (256: bytes)", at_least=2)
    block_size: int = key(64, "the longest context, in tokens", at_least=1)
    n_layer: int = key(4, "transformer blocks", at_least=1)
    n_head: int = key(4, "attention heads per block (must divide n_embd)", at_least=1)
    n_embd: int = key(128, "width of the residual stream", at_least=1)
    dropout: float = key(0.0, "dropout after attention and MLP (0: none, deterministic)", at_least=0)


@dataclass
class HFModelConfig(ModelConfig):
    config: str = key(MISSING, "a transformers model type (gpt2, llama, ...) or a directory save_pretrained wrote")
    head: str = key("causal_lm", "causal_lm | sequence_classification | masked_lm", ok=one_of(
        ("causal_lm", "sequence_classification", "masked_lm")), rule="causal_lm, sequence_classification or masked_lm")
    overrides: Dict[str, Any] = key({}, "the configuration's fields to change (+model.overrides.n_layer=4)")
    max_shard_mb: int = key(50_000, "the run's hf/ directory: weights above this many MB (10^6 bytes) are written "
                                    "in files of at most this much with model.safetensors.index.json, as "
                                    "save_pretrained's max_shard_size (50GB)", at_least=1)


# ---------------------------------------------------------------- data
@dataclass
class DataConfig:
    _target_: str = key(MISSING, "the callable that returns (train, test) Datasets of (input, target) pairs")
    batch_size: int = key(512, "GLOBAL batch, split evenly over the ranks (d2l: 256)", at_least=1,
                          rule="a positive global batch size")
    loader: Loader = key(Loader.auto, "auto (device where the data is tensors) | device: the whole split on "
                                      "the training device | dataloader: torch's DataLoader")
    num_workers: int = key(0, "DataLoader worker processes per rank (loader=dataloader only)", at_least=0)
    task: Task = key(Task.auto, "auto (regression where the targets are floats, language_model where a target "
                                "is a sequence) | classification | language_model (next-token prediction) | "
                                "regression (the loss alone: trainer.loss, MSE by default)")
    input_key: str = key("", "samples that are dicts (Hugging Face datasets): the input's key (empty: samples "
                             "are (input, target) pairs)")
    target_key: str = key("", "samples that are dicts: the target's key (set with data.input_key)")


@dataclass
class ImageDataConfig(DataConfig):
    normalize: bool = key(True, "scale pixels with mean and std (false: [0, 1], as d2l's ToTensor)")
    mean: float = key(0.2860, "pixel mean to subtract (Fashion-MNIST's training set)")
    std: float = key(0.3530, "pixel std to divide by (Fashion-MNIST's training set)", ok=positive_finite,
                     rule="a positive, finite number")


@dataclass
class FashionMNISTConfig(ImageDataConfig):
    root: Optional[str] = key(None, "folder with the four .gz IDX files, or a torchvision root; "
                                    "null: the Debian package's folder")
    download: bool = key(False, "let torchvision download the files when none are found locally")
    cache_dir: str = key("~/.cache/ddp_lab", "where the gzipped files are unpacked once for torchvision")


@dataclass
class SyntheticConfig(ImageDataConfig):
    image_shape: List[int] = key([1, 28, 28], "[channels, height, width]")
    num_classes: int = key(10, "labels drawn from 0..num_classes-1", at_least=1)
    num_train: int = key(60000, "training images per epoch", at_least=1)
    num_test: int = key(10000, "test images", at_least=1)
    seed: int = key(0, "the images' seed (the preset: the run's seed)")


@dataclass
class TextConfig(DataConfig):
    path: str = key("/usr/share/games/fortunes", "a plain-text file, or a folder whose text files are read "
                                                 "in name order (default: Debian's fortunes)")
    block_size: int = key(64, "tokens per sample (the preset: model.block_size)", at_least=1)
    val_fraction: float = key(0.1, "the corpus's last part held out for validation", ok=fraction,
                              rule="a fraction between 0 and 1")


@dataclass
class TextDocumentsConfig(TextConfig):
    separator: str = key("\n%\n", "what ends a document (fortune's `%` lines)")


# ---------------------------------------------------------------- optim
@dataclass
class OptimConfig:
    _target_: str = key(MISSING, "the optimizer class (torch.optim.SGD, torch.optim.AdamW, or any)")
    lr: float = key(0.2, "peak learning rate for the global batch", ok=positive_finite,
                    rule="a positive, finite number (e.g. optim.lr=0.1)")
    schedule: Schedule = key(Schedule.cosine, "constant | cosine (decays to 0 over the run)")
    warmup_epochs: float = key(1.0, "linear warm-up from about 0, in epochs (0: none)", at_least=0)
    warmup_steps: int = key(0, "linear warm-up in optimizer steps; when > 0 it replaces warmup_epochs",
                            at_least=0)
    clip_grad_norm: float = key(0.0, "clip the gradients' norm over the whole model to this before each step "
                                     "(0: off; under sync=zero the norm over every rank's shard)", at_least=0)
    no_decay: Any = key("none", "parameters stepped with weight_decay 0: none | 1d (biases, norms, every 1-D "
                                "tensor) | a list of name patterns, 1d among them if wanted (e.g. [1d,'*.wte.*'])")
    elementwise: str = key("auto", "the optimizer treats each element alone (SGD, Adam, AdamW...), so sync=zero "
                                   "may hand it flat chunks of many tensors: auto (torch's known ones) | true | false",
                           ok=one_of(("auto", "true", "false")), rule="one of auto, true, false")
    implementation: str = key("auto", "the kernels torch's optimizer steps with: auto (fused on a GPU, where torch's "
                                      "optimizer has them: one launch, and fp16 skips a step without reading the "
                                      "device; else torch's default) | fused | foreach | for_loop",
                              ok=one_of(("auto", "fused", "foreach", "for_loop")),
                              rule="one of auto, fused, foreach, for_loop")


@dataclass
class SGDConfig(OptimConfig):
    momentum: float = key(0.9, "0 gives d2l's plain SGD", at_least=0)
    weight_decay: float = key(0.0005, "L2 penalty", at_least=0)
    nesterov: bool = key(True, "Nesterov momentum (needs momentum > 0)")


@dataclass
class AdamWConfig(OptimConfig):
    betas: List[float] = key([0.9, 0.95], "Adam's moment decay rates (nanoGPT's)")
    eps: float = key(1e-8, "added to the denominator", ok=positive_finite, rule="a positive, finite number")
    weight_decay: float = key(0.1, "decoupled weight decay", at_least=0)


# the group, its base (what ddp_lab reads) and the shipped presets' schemas
BASES = {"model": ModelConfig, "data": DataConfig, "optim": OptimConfig}
PRESETS = {
    "model": {"image": ImageModelConfig, "lenet_fast": LeNetFastConfig, "gpt": GPTConfig, "hf": HFModelConfig},
    "data": {"fashion_mnist": FashionMNISTConfig, "synthetic": SyntheticConfig, "text": TextConfig,
             "text_documents": TextDocumentsConfig},
    "optim": {"sgd": SGDConfig, "adamw": AdamWConfig},
}


# the keys of each group that ddp_lab reads itself and does not pass to the callable
OWN_KEYS = {"model": ("name", "pretrained", "max_shard_mb"),
            "data": ("batch_size", "loader", "num_workers", "task", "input_key", "target_key"),
            "optim": ("schedule", "warmup_epochs", "warmup_steps", "clip_grad_norm", "no_decay", "elementwise",
                      "implementation")}


def base_defaults(group: str) -> dict:
    """The group's node before a preset is merged on it: ddp_lab's own keys at their defaults,
    so a user's preset need not state them (and `data.batch_size=64` works on it)."""
    out = {}
    for f in fields(BASES[group]):
        if f.name in OWN_KEYS[group]:
            out[f.name] = f.default.value if isinstance(f.default, Enum) else f.default
    return out


def register() -> None:
    """The presets' schemas, as `schema_<name>` in their groups (for a preset's defaults list)."""
    store = ConfigStore.instance()
    for group, presets in PRESETS.items():
        for name, node in presets.items():
            store.store(group=group, name=f"schema_{name}", node=node)
