"""What every model shares: building one from its conf/model entry, the chapter's
weight init and SyncBatchNorm, and the sizes the cost model and logs need."""
from __future__ import annotations

from importlib.resources import files

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch import nn

from ddp_lab import data
from ddp_lab.config import ConfigError
from ddp_lab.schema import ModelConfig


def _d2l_init(m: nn.Module) -> None:
    # The chapter initialises every conv and linear weight from N(0, 0.01^2).
    if isinstance(m, (nn.Linear, nn.Conv2d)):
        nn.init.normal_(m.weight, std=0.01)


def finish(net: nn.Module, init: str, sync_bn: bool) -> nn.Module:
    """Apply the chosen init and, for multi-process BatchNorm, SyncBatchNorm."""
    if init == "d2l":
        net.apply(_d2l_init)
    elif init != "default":  # (the config's schema allows only these two)
        raise ValueError(f"unknown init {init!r}")
    if sync_bn:
        net = nn.SyncBatchNorm.convert_sync_batchnorm(net)
    return net


def num_parameters(net: nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())


def gradient_bytes(net: nn.Module) -> int:
    """Bytes all-reduced per step: every trainable parameter's gradient."""
    return sum(p.numel() * p.element_size() for p in net.parameters() if p.requires_grad)


def build_model(cfg) -> nn.Module:
    """Instantiate `cfg.model`; its `name` key labels the run and is not an argument.

    Keys left at None are ones the schema knows but this model does not take.
    """
    args = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True, enum_to_str=True).items()
            if k != "name" and v is not None}
    try:
        return instantiate(args)
    except InstantiationException as e:
        if isinstance(e.__cause__, ConfigError):  # a bad value, not a bug: say it plainly
            raise e.__cause__ from None
        if isinstance(e.__cause__, TypeError) and "unexpected keyword" in str(e.__cause__):
            key = str(e.__cause__).rsplit("'", 2)[-2]
            raise ConfigError(f"model.{key} does not apply to model {cfg.get('name')!r}; "
                              f"drop the override") from None
        raise


def check_sync_bn(model: nn.Module, distributed: bool, device: torch.device) -> None:
    """torch's SyncBatchNorm runs on GPU ranks only."""
    if distributed and device.type == "cpu" and any(
            isinstance(m, nn.SyncBatchNorm) for m in model.modules()):
        raise ConfigError("model.sync_bn=true needs GPU ranks: torch's SyncBatchNorm does not "
                          "run on CPU. Set model.sync_bn=false (each rank then normalises "
                          "with its own batch's statistics)")


def check_fits_data(cfg) -> None:
    """Refuse, before training, data the model cannot take: another number of channels,
    images its layers do not fit, labels beyond the classes it predicts. One image's forward pass on the meta device
    (shapes only: no arithmetic, no memory) finds both, for any model."""
    shape, classes, name = data.image_shape(cfg.data), data.num_classes(cfg.data), cfg.model.get("name")
    if shape[0] != cfg.model.in_channels:
        raise ConfigError(f"model.in_channels={cfg.model.in_channels} but the data has "
                          f"{shape[0]} channel(s); set model.in_channels={shape[0]}")
    with torch.device("meta"):
        net = build_model(cfg.model).eval()
    logits, error = _dry_forward(net, shape)
    if logits is None:
        raise ConfigError(_misfit(net, shape, name, error))
    predicts = logits[-1]
    if classes > predicts and cfg.data.name == "synthetic":
        raise ConfigError(f"data.num_classes={classes} is more than model.num_classes={predicts}, the "
                          f"classes model={name} predicts: set model.num_classes={classes} "
                          f"(or data.num_classes<={predicts})")
    if classes > predicts:
        raise ConfigError(f"model.num_classes={predicts} is fewer than the {classes} classes of "
                          f"Fashion-MNIST: set model.num_classes={classes}")


def _dry_forward(net: nn.Module, shape: tuple) -> tuple[torch.Size | None, str]:
    """(the logits' shape, "") for one image of `shape`, or (None, torch's error line)."""
    try:
        with torch.no_grad():
            return net(torch.empty(1, *shape, device="meta")).shape, ""
    except RuntimeError as e:  # a kernel larger than its input, a flattened size that does not match
        return None, str(e).strip().splitlines()[0].rstrip(".")


def _misfit(net: nn.Module, shape: tuple, name: str, error: str) -> str:
    """The error line for images the model does not take, with the square ones it does."""
    c, h, w = shape
    limit = max(64, min(2 * max(h, w), 512))  # in the error path only: a few ms a size on meta
    fits = [n for n in range(1, limit + 1) if _dry_forward(net, (c, n, n))[0] is not None]
    if not fits:
        return f"data.image_shape={list(shape)} does not fit model={name} ({error})"
    smallest = [c, fits[0], fits[0]]
    largest = f" and the largest {[c, fits[-1], fits[-1]]}" if fits[-1] < limit else ""
    what = (f"is too small for model={name}" if h < fits[0] or w < fits[0]
            else f"does not fit model={name} ({error})")
    return (f"data.image_shape={list(shape)} {what}: the smallest image it takes is {smallest}{largest}; "
            f"set data.image_shape={smallest} (or use another model)")


def load_model_config(name: str):
    """The shipped conf/model/<name>.yaml over the schema's defaults, as a run composes it,
    for tools that need a model outside a run."""
    path = files("ddp_lab.conf") / "model" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.name[:-5] for p in (files("ddp_lab.conf") / "model").iterdir()
                       if p.name.endswith(".yaml"))
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(known)}")
    return OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(str(path)))
