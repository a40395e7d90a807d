"""The two networks of the d2l multi-GPU chapter, as nn.Modules.

Both are built from config (`conf/model/*.yaml`, `_target_` points here), so a
new model is a function plus a YAML file.
"""
from __future__ import annotations

from hydra.errors import InstantiationException
from torch import nn
from torchvision.models.resnet import BasicBlock

from ddp_lab.config import ConfigError


def lenet(num_classes: int = 10, in_channels: int = 1, init: str = "default",
          sync_bn: bool = False) -> nn.Module:
    """The seeds' LeNet for 28x28 inputs: conv3x3(20)-pool-conv5x5(50)-pool-fc128-fc.

    28 -> conv3 -> 26 -> pool -> 13 -> conv5 -> 9 -> pool -> 4, so 50*4*4 = 800
    features reach the first linear layer, as in the seeds' (800, 128) weight.
    """
    net = nn.Sequential(
        nn.Conv2d(in_channels, 20, kernel_size=3), nn.ReLU(), nn.AvgPool2d(2),
        nn.Conv2d(20, 50, kernel_size=5), nn.ReLU(), nn.AvgPool2d(2),
        nn.Flatten(),
        nn.Linear(800, 128), nn.ReLU(),
        nn.Linear(128, num_classes),
    )
    return finish(net, init, sync_bn)


def _stage(in_ch: int, out_ch: int, stride: int) -> nn.Sequential:
    """Two torchvision BasicBlocks; the first downsamples with a 1x1 conv when needed."""
    downsample = None
    if stride != 1 or in_ch != out_ch:
        downsample = nn.Sequential(
            nn.Conv2d(in_ch, out_ch, kernel_size=1, stride=stride, bias=False),
            nn.BatchNorm2d(out_ch),
        )
    return nn.Sequential(BasicBlock(in_ch, out_ch, stride, downsample),
                         BasicBlock(out_ch, out_ch))


def resnet18(num_classes: int = 10, in_channels: int = 1, init: str = "default",
             sync_bn: bool = False) -> nn.Module:
    """d2l's small-image ResNet-18: 3x3 stride-1 stem, no max-pool, 4 stages of 2 blocks."""
    net = nn.Sequential(
        nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False),
        nn.BatchNorm2d(64), nn.ReLU(inplace=True),
        _stage(64, 64, 1), _stage(64, 128, 2), _stage(128, 256, 2), _stage(256, 512, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes),
    )
    return finish(net, init, sync_bn)


def _d2l_init(m: nn.Module) -> None:
    # The chapter initialises every conv and linear weight from N(0, 0.01^2).
    if isinstance(m, (nn.Linear, nn.Conv2d)):
        nn.init.normal_(m.weight, std=0.01)


def finish(net: nn.Module, init: str, sync_bn: bool) -> nn.Module:
    """Apply the chosen init and, for multi-process BatchNorm, SyncBatchNorm."""
    if init == "d2l":
        net.apply(_d2l_init)
    elif init != "default":
        raise ConfigError(f"model.init={init!r} is not one of default, d2l")
    if sync_bn:
        net = nn.SyncBatchNorm.convert_sync_batchnorm(net)
    return net


def num_parameters(net: nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())


def gradient_bytes(net: nn.Module) -> int:
    """Bytes all-reduced per step: every trainable parameter's gradient."""
    return sum(p.numel() * p.element_size() for p in net.parameters() if p.requires_grad)


def build_model(cfg) -> nn.Module:
    """Instantiate `cfg.model`; its `name` key labels the run and is not an argument."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    args = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k != "name"}
    try:
        return instantiate(args)
    except InstantiationException as e:
        if isinstance(e.__cause__, ConfigError):  # a bad value, not a bug: say it plainly
            raise e.__cause__ from None
        raise


def load_model_config(name: str):
    """The shipped conf/model/<name>.yaml, for tools that need a model outside a run."""
    from importlib.resources import files
    from omegaconf import OmegaConf

    path = files("ddp_lab.conf") / "model" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.name[:-5] for p in (files("ddp_lab.conf") / "model").iterdir()
                       if p.name.endswith(".yaml"))
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(known)}")
    return OmegaConf.load(str(path))
