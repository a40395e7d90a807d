"""What every model shares: building one from its conf/model entry, the chapter's
weight init and SyncBatchNorm, and the sizes the cost model and logs need."""
from __future__ import annotations

from importlib.resources import files

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch import nn

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


def load_model_config(name: str):
    """The shipped conf/model/<name>.yaml over the schema's defaults, as a run composes it,
    for tools that need a model outside a run."""
    path = files("ddp_lab.conf") / "model" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.name[:-5] for p in (files("ddp_lab.conf") / "model").iterdir()
                       if p.name.endswith(".yaml"))
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(known)}")
    return OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(str(path)))
