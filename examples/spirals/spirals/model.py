"""The model: a plain MLP over 2-D points."""
from torch import nn


def mlp(in_features: int = 2, hidden: int = 64, depth: int = 3, num_classes: int = 2) -> nn.Module:
    layers, width = [], in_features
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.Tanh()]
        width = hidden
    return nn.Sequential(*layers, nn.Linear(width, num_classes))
