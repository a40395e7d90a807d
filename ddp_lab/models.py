"""The two networks of the d2l multi-GPU chapter, as nn.Modules.

Both are built from config (`conf/model/*.yaml`, `_target_` points here), so a
new model is a function plus a YAML file.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from hydra.errors import InstantiationException
from torch import nn
from torchvision.models.resnet import BasicBlock

from ddp_lab.config import ConfigError


class LeNet(nn.Sequential):
    """The seeds' LeNet for 28x28 inputs: conv3x3(20)-pool-conv5x5(50)-pool-fc128-fc.

    28 -> conv3 -> 26 -> pool -> 13 -> conv5 -> 9 -> pool -> 4, so 50*4*4 = 800
    features reach the first linear layer, as in the seeds' (800, 128) weight.

    Each 2x2 pool drops an odd last row and column, so part of every layer's
    output never reaches the logits: conv2's 9th row and column, pool1's 13th,
    conv1's 25th and 26th, the input's last two. With `crop_unused_border` the
    input is cut to the part that matters (26x26 of 28x28) before conv1, so
    conv1 computes 24x24 instead of 26x26 and conv2 8x8 instead of 9x9 (21% of
    the model's arithmetic). The logits and gradients are the same function of
    the same parameters; only the summation order of a few sums changes.

    With `pad_channels_to` (32 by default), a LeNet compiled by torch.compile
    on CPU computes conv1's 20 output channels as 32: 12 extra all-zero
    filters, whose channels stay zero through ReLU and pooling and are dropped
    before conv2. The point is the backward of pool 1 and its ReLU, which
    inductor writes as one loop over rows of channels: 20 bf16 channels make
    it handle every pixel as a 16-wide vector plus a slow 4-wide remainder
    (4 ms of a 21 ms step on the 2-core development machine), 32 channels as
    one whole 32-wide vector (0.6 ms). oneDNN's convolutions cost the same
    either way. Same logits and gradients; eager runs (and other devices)
    compute the 20 channels as they are, since eager's kernels gain nothing.
    """

    def __init__(self, *layers: nn.Module, crop_unused_border: bool = True,
                 pad_channels_to: int = 32):
        super().__init__(*layers)
        self.crop_unused_border = crop_unused_border
        self.pad_channels_to = pad_channels_to

    def forward(self, x):
        if self.crop_unused_border:
            h, w = (live_input_extent(n) for n in x.shape[-2:])
            x = x[..., :h, :w]
        if self.pad_channels_to and x.device.type == "cpu" and torch.compiler.is_compiling():
            return self.forward_padded(x)
        return super().forward(x)

    def forward_padded(self, x):
        """forward() with conv1's output channels padded to a multiple of pad_channels_to."""
        conv, relu, pool, *rest = self
        extra = -conv.out_channels % self.pad_channels_to
        weight = F.pad(conv.weight, (0, 0, 0, 0, 0, 0, 0, extra))  # zero filters after the real ones
        bias = F.pad(conv.bias, (0, extra))
        x = F.conv2d(x, weight, bias, conv.stride, conv.padding, conv.dilation, conv.groups)
        # Dropping the padded channels leaves a strided view (in NHWC, 20 of
        # every 32 values); copied here, the copy is fused into pooling's
        # kernel, where oneDNN would otherwise copy it for conv2's forward and
        # again for its backward (0.5 ms of a 19.6 ms step), and conv2's
        # backward ran 13% slower on the view (6.7 against 5.9 ms).
        x = pool(relu(x))[:, : conv.out_channels].clone(memory_format=torch.preserve_format)
        for layer in rest:
            x = layer(x)
        return x


def live_input_extent(n: int) -> int:
    """Input rows (or columns) of LeNet that reach its output, for an n-pixel side.

    Walks the layers forward to the final pooled size, then back to the input
    span that pooled output depends on.
    """
    pooled = ((n - 2) // 2 - 4) // 2  # conv3, pool2, conv5, pool2, each flooring
    if pooled < 1:
        return n  # too small for LeNet at all: leave the error to the layer that fails
    return (2 * pooled + 4) * 2 + 2   # back through pool2, conv5, pool2, conv3


def lenet(num_classes: int = 10, in_channels: int = 1, init: str = "default",
          sync_bn: bool = False, crop_unused_border: bool = True,
          pad_channels_to: int = 32) -> nn.Module:
    """The seeds' LeNet (see `LeNet`); `crop_unused_border=False` computes every pixel,
    `pad_channels_to=0` computes conv1's 20 channels as they are when compiled."""
    if pad_channels_to < 0:
        raise ConfigError(f"model.pad_channels_to={pad_channels_to} must be >= 0 (0: off)")
    net = LeNet(
        nn.Conv2d(in_channels, 20, kernel_size=3), nn.ReLU(), nn.AvgPool2d(2),
        nn.Conv2d(20, 50, kernel_size=5), nn.ReLU(), nn.AvgPool2d(2),
        nn.Flatten(),
        nn.Linear(800, 128), nn.ReLU(),
        nn.Linear(128, num_classes),
        crop_unused_border=crop_unused_border, pad_channels_to=pad_channels_to,
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
    """Instantiate `cfg.model`; its `name` key labels the run and is not an argument.

    Keys left at None are ones the schema knows but this model does not take.
    """
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    args = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items()
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
    """The shipped conf/model/<name>.yaml, for tools that need a model outside a run."""
    from importlib.resources import files
    from omegaconf import OmegaConf

    path = files("ddp_lab.conf") / "model" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.name[:-5] for p in (files("ddp_lab.conf") / "model").iterdir()
                       if p.name.endswith(".yaml"))
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(known)}")
    return OmegaConf.load(str(path))
