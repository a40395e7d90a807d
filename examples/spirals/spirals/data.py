"""The dataset: points on interleaved spiral arms, the arm is the class.

A map-style torch Dataset computed per sample (no tensors held), so ddp_lab
feeds it through torch's DataLoader; returning a TensorDataset instead would
let it hold the whole split on the training device.
"""
import math

import torch
from torch.utils.data import Dataset


class Spirals(Dataset):
    def __init__(self, size: int, arms: int, turns: float, noise: float, seed: int):
        self.size, self.arms, self.turns, self.noise, self.seed = size, arms, turns, noise, seed

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)  # sample i is the same on every rank
        arm = i % self.arms
        t = torch.rand(1, generator=g).item()  # how far along its arm
        angle = 2 * math.pi * (self.turns * t + arm / self.arms)
        point = torch.tensor([t * math.cos(angle), t * math.sin(angle)])
        return point + self.noise * torch.randn(2, generator=g), arm


def spirals(num_train: int = 8192, num_test: int = 2048, arms: int = 3, turns: float = 0.75,
            noise: float = 0.02):
    """(train, test): ddp_lab calls this with the keys of conf/data/spirals.yaml."""
    return (Spirals(num_train, arms, turns, noise, seed=1), Spirals(num_test, arms, turns, noise, seed=2))
