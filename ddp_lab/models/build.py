"""What every model shares: building one from its conf/model entry, the chapter's
weight init and SyncBatchNorm, and the sizes the cost model and logs need."""
from __future__ import annotations

from importlib.resources import files

import torch
from omegaconf import OmegaConf
from torch import nn

from ddp_lab.config import ConfigError, presets, targets
from ddp_lab.models.calling import check_takes_keys, loss_and_logits, shifts_labels


def _d2l_init(m: nn.Module) -> None:
    # The chapter initialises every conv and linear weight from N(0, 0.01^2).
    if isinstance(m, (nn.Linear, nn.Conv2d)):
        nn.init.normal_(m.weight, std=0.01)


def finish(net: nn.Module, init: str, sync_bn: bool) -> nn.Module:
    """Apply the chosen init and, for multi-process BatchNorm, SyncBatchNorm."""
    if init == "d2l":
        net.init_weights = _d2l_init  # (declared, so that a meta-device build replays it: models/meta_init.py)
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


def model_name(cfg) -> str:
    """The model's label: `model.name`, else its callable's name (torchvision.models.resnet18 -> resnet18)."""
    return cfg.get("name") or str(cfg.get("_target_", "model")).rsplit(".", 1)[-1]


def build_model(cfg) -> nn.Module:
    """Call `cfg._target_` (the model group) with every key but `name` as an argument."""
    net = targets.build("model", cfg)
    if not isinstance(net, nn.Module):
        raise ConfigError(f"model._target_={cfg['_target_']} returned {type(net).__name__}, not an "
                          f"nn.Module: return the network")
    return net


def check_sync_bn(model: nn.Module, distributed: bool, device: torch.device) -> None:
    """torch's SyncBatchNorm runs on GPU ranks only."""
    if distributed and device.type == "cpu" and any(
            isinstance(m, nn.SyncBatchNorm) for m in model.modules()):
        raise ConfigError("model.sync_bn=true needs GPU ranks: torch's SyncBatchNorm does not "
                          "run on CPU. Set model.sync_bn=false (each rank then normalises "
                          "with its own batch's statistics)")


def check_fits_data(model, data, x: torch.Tensor, y: torch.Tensor, task, classes: int) -> torch.Size:
    """Refuse, before training, data the model cannot take: inputs its layers do not fit,
    outputs of another shape than the targets, targets beyond the classes it predicts.
    One sample's forward pass on the meta device (shapes only: no arithmetic, no
    memory) finds them all, for any model. x, y: one sample; classes: the largest
    target + 1; model, data: their config groups. Returns the output's shape for one input."""
    m, name = model, model_name(model)
    image = x.dim() == 3 and x.is_floating_point()
    if image and "in_channels" in m and x.shape[0] != m.in_channels:
        raise ConfigError(f"model.in_channels={m.in_channels} but the data has "
                          f"{x.shape[0]} channel(s); set model.in_channels={x.shape[0]}")
    with torch.device("meta"):
        net = build_model(m).eval()
    out, error = _dry_forward(net, x)
    if out is None and image and "image_shape" in data:
        raise ConfigError(_misfit(net, tuple(x.shape), name, error))
    if out is None:
        raise ConfigError(f"model={name} cannot take the data's inputs (one is {list(x.shape)}, "
                          f"{str(x.dtype).removeprefix('torch.')}): {error}; fix the model's settings or the data")
    if task.name == "regression":  # an output per target value (a trailing 1 for a scalar target)
        if tuple(out) not in ((1, *y.shape), (1, *y.shape, 1)):
            raise ConfigError(f"model={name} outputs {list(out)} for one input, but a regression target is "
                              f"{list(y.shape) or 'one number'}: the model must output {[1, *y.shape]} "
                              f"(or {[1, *y.shape, 1]})")
        return out
    if tuple(out[:-1]) != (1, *y.shape):
        raise ConfigError(f"model={name} outputs {list(out)} for one input, but a {task.name} target is "
                          f"{list(y.shape) or 'one class id'}: the model must output {[1, *y.shape, 'classes']}")
    _check_classes(model, data, name, out[-1], classes)
    return out


def check_takes_dicts(model, sample: dict) -> bool:
    """A model fed dict samples (model: its group; `sample`: one) takes their keys by keyword and returns a loss or
    logits for them: one forward on fake tensors (shapes only; a transformers model skips its checks of values
    there). Returns whether its own loss shifts the labels (a causal LM)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with torch.device("meta"):
        net = build_model(model).eval()
    name = model_name(model)
    check_takes_keys(net, list(sample), name)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
            out = net(**{k: torch.zeros(1, *v.shape, dtype=v.dtype, device="meta") for k, v in sample.items()})
    except (RuntimeError, ValueError, IndexError, TypeError, AssertionError) as e:
        error = (str(e).strip().splitlines() or [type(e).__name__])[0].rstrip(".")
        shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in sample.items())
        raise ConfigError(f"model={name} cannot take the data's samples ({shapes}): {error}; fix the model's "
                          f"settings or the data") from None
    loss_and_logits(out)  # (one line where it returns neither)
    return shifts_labels(net)


def _check_classes(model, data, name: str, predicts: int, classes: int) -> None:
    if classes <= predicts:
        return
    if "num_classes" in data and "num_classes" in model:
        raise ConfigError(f"data.num_classes={classes} is more than model.num_classes={predicts}, the "
                          f"classes model={name} predicts: set model.num_classes={classes} "
                          f"(or data.num_classes<={predicts})")
    for key in ("num_classes", "vocab_size"):
        if key in model:
            raise ConfigError(f"model.{key}={predicts} is fewer than the {classes} classes of the data: "
                              f"set model.{key}={classes}")
    raise ConfigError(f"the data's targets go up to {classes - 1} but model={name} predicts {predicts} "
                      f"classes: widen the model's output to {classes}")


def _dry_forward(net: nn.Module, x: torch.Tensor) -> tuple[torch.Size | None, str]:
    """(the output's shape, "") for one input like `x`, or (None, torch's error line)."""
    try:
        with torch.no_grad():
            return net(torch.empty(1, *x.shape, dtype=x.dtype, device="meta")).shape, ""
    except (RuntimeError, ValueError, IndexError, TypeError, AssertionError) as e:
        return None, (str(e).strip().splitlines() or [type(e).__name__])[0].rstrip(".")


def _misfit(net: nn.Module, shape: tuple, name: str, error: str) -> str:
    """The error line for images the model does not take, with the square ones it does."""
    c, h, w = shape
    limit = max(64, min(2 * max(h, w), 512))  # in the error path only: a few ms a size on meta
    fits = [n for n in range(1, limit + 1) if _dry_forward(net, torch.empty(c, n, n, device="meta"))[0] is not None]
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
    preset = OmegaConf.load(str(path))
    defaults = preset.pop("defaults", [])  # the schema it starts from, or another preset
    base = next(str(d) for d in defaults if str(d) != "_self_")
    schema = (OmegaConf.structured(presets.PRESETS["model"][base.removeprefix("schema_")])
              if base.startswith("schema_") else load_model_config(base))
    return OmegaConf.merge(schema, preset)
