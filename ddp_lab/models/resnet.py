"""d2l's small-image ResNet-18 (model=resnet18)."""
from __future__ import annotations

from torch import nn
from torchvision.models.resnet import BasicBlock

from ddp_lab.models.build import finish


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
    """3x3 stride-1 stem, no max-pool, 4 stages of 2 blocks, 11,172,810 parameters."""
    net = nn.Sequential(
        nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False),
        nn.BatchNorm2d(64), nn.ReLU(inplace=True),
        _stage(64, 64, 1), _stage(64, 128, 2), _stage(128, 256, 2), _stage(256, 512, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes),
    )
    return finish(net, init, sync_bn)
