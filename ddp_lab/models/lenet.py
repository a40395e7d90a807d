"""The LeNet of d2l's multi-GPU chapter, as the chapter wrote it (model=lenet)."""
from __future__ import annotations

from torch import nn

from ddp_lab.models.build import finish


def lenet_layers(num_classes: int = 10, in_channels: int = 1) -> list[nn.Module]:
    """The chapter's layers in order, for 28x28 inputs.

    28 -> conv3 -> 26 -> pool -> 13 -> conv5 -> 9 -> pool -> 4, so 50*4*4 = 800
    features reach the first linear layer, as in the chapter's (800, 128) weight.
    """
    return [
        nn.Conv2d(in_channels, 20, kernel_size=3), nn.ReLU(), nn.AvgPool2d(2),
        nn.Conv2d(20, 50, kernel_size=5), nn.ReLU(), nn.AvgPool2d(2),
        nn.Flatten(),
        nn.Linear(800, 128), nn.ReLU(),
        nn.Linear(128, num_classes),
    ]


def lenet(num_classes: int = 10, in_channels: int = 1, init: str = "default",
          sync_bn: bool = False) -> nn.Sequential:
    """conv3x3(20)-ReLU-avgpool-conv5x5(50)-ReLU-avgpool-fc800->128-ReLU-fc, 129,068 parameters."""
    return finish(nn.Sequential(*lenet_layers(num_classes, in_channels)), init, sync_bn)
