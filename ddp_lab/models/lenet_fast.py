"""LeNet reshaped for speed (model=lenet_fast): the same function of the same weights
as model=lenet, computed with less arithmetic and, under torch.compile on CPU, in a
channel layout whose kernels run on whole vectors.

Its layers are lenet's (`lenet_layers`), so the state_dict keys are the same and
weights move between the two models; tests/models/test_lenet_fast.py checks in
float64 that the logits and gradients are equal. Which of the two trains faster
depends on the machine (docs/defaults.md, "`model=lenet_fast`: `pad_channels_to=32`").
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ddp_lab.config import ConfigError
from ddp_lab.models.build import finish
from ddp_lab.models.lenet import lenet_layers


class LeNetFast(nn.Sequential):
    """LeNet's layers with two reshapings that leave the logits and gradients alone.

    `crop_unused_border`: each 2x2 pool drops an odd last row and column, so
    part of every layer's output never reaches the logits: conv2's 9th row and
    column, pool1's 13th, conv1's 25th and 26th, the input's last two. The
    input is cut to the part that matters (26x26 of 28x28) before conv1, so
    conv1 computes 24x24 instead of 26x26 and conv2 8x8 instead of 9x9 (21%
    less arithmetic); only the summation order of a few sums changes.

    `pad_channels_to` (32 by default; 0: off), only when compiled by
    torch.compile on CPU under bf16 autocast: conv1's 20 output channels are
    computed as 32, the 12 extra filters all zeros, whose channels stay zero
    through ReLU and pooling and are dropped before conv2. Inductor writes
    pool 1's backward (with its ReLU) as one loop over each pixel's row of
    channels: with bf16 on an avx512_bf16 CPU, 20 channels became a 16-wide
    vector plus a slow 4-wide remainder, 32 channels one whole 32-wide vector.
    In float32 the padding only added work (compiled, fewer images/s padded
    than not), and eager kernels gain nothing from it, so float32, eager runs
    and other devices compute the 20 channels as they are.
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
        if self.pad_channels_to and compiling_bf16_on_cpu(x):
            return self.forward_padded(x)
        return super().forward(x)

    def forward_padded(self, x):
        """forward() with conv1's output channels padded to a multiple of pad_channels_to."""
        conv, relu, pool, *rest = self
        extra = -conv.out_channels % self.pad_channels_to
        weight = F.pad(conv.weight, (0, 0, 0, 0, 0, 0, 0, extra))  # zero filters after the real ones
        bias = F.pad(conv.bias, (0, extra))
        x = F.conv2d(x, weight, bias, conv.stride, conv.padding, conv.dilation, conv.groups)
        # The real channels are copied out rather than left as a strided view
        # (in NHWC, 20 of every 32 values): inductor fuses the copy into
        # pooling's kernel, where oneDNN would otherwise copy the view for
        # conv2's forward and again for its backward, and run conv2's backward
        # slower on it.
        x = pool(relu(x))[:, : conv.out_channels].clone(memory_format=torch.preserve_format)
        for layer in rest:
            x = layer(x)
        return x


def compiling_bf16_on_cpu(x: torch.Tensor) -> bool:
    """Whether torch.compile is tracing a CPU forward under bf16 autocast (a compiled
    model is traced again when the autocast state changes)."""
    return (x.device.type == "cpu" and torch.compiler.is_compiling()
            and torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16)


def live_input_extent(n: int) -> int:
    """Input rows (or columns) of LeNet that reach its output, for an n-pixel side.

    Walks the layers forward to the final pooled size, then back to the input
    span that pooled output depends on.
    """
    pooled = ((n - 2) // 2 - 4) // 2  # conv3, pool2, conv5, pool2, each flooring
    if pooled < 1:
        return n  # too small for LeNet at all: leave the error to the layer that fails
    return (2 * pooled + 4) * 2 + 2   # back through pool2, conv5, pool2, conv3


def lenet_fast(num_classes: int = 10, in_channels: int = 1, init: str = "default",
               sync_bn: bool = False, crop_unused_border: bool = True,
               pad_channels_to: int = 32) -> LeNetFast:
    """LeNet as `LeNetFast` computes it; both reshapings can be turned off to measure each."""
    if pad_channels_to < 0:
        raise ConfigError(f"model.pad_channels_to={pad_channels_to} must be >= 0 (0: off)")
    net = LeNetFast(*lenet_layers(num_classes, in_channels),
                    crop_unused_border=crop_unused_border, pad_channels_to=pad_channels_to)
    return finish(net, init, sync_bn)
