"""A user's dataset held as Python objects: spiral points as a list of ([x, y], arm), as parsed data often is."""
import math

import torch


class Points(torch.utils.data.Dataset):
    def __init__(self, n: int, seed: int, arms: int = 3):
        g = torch.Generator().manual_seed(seed)
        t = torch.rand(n, generator=g)
        arm = torch.arange(n) % arms
        angle = 2 * math.pi * (0.75 * t + arm / arms)
        xy = torch.stack([t * torch.cos(angle), t * torch.sin(angle)], 1) + 0.02 * torch.randn(n, 2, generator=g)
        self.samples = list(zip(xy.tolist(), arm.tolist()))  # Python floats, lists and tuples: no tensor

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        xy, arm = self.samples[i]
        return torch.tensor(xy), arm


def points(num_train: int = 1_000_000, num_test: int = 20_000):
    return Points(num_train, 1), Points(num_test, 2)
