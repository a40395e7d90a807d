"""A user's model and data as a test defines them: vectors, not images (and some broken ones)."""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset


def blobs(num_train: int = 1024, num_test: int = 256, dim: int = 8, classes: int = 4, seed: int = 0):
    """Gaussian clusters in `dim` dimensions, one per class: (train, test) TensorDatasets."""
    g = torch.Generator().manual_seed(seed)
    centres = 2 * torch.randn(classes, dim, generator=g)
    out = []
    for n in (num_train, num_test):
        y = torch.randint(0, classes, (n,), generator=g)
        out.append(TensorDataset(centres[y] + torch.randn(n, dim, generator=g), y))
    return out[0], out[1]


def linear(dim: int = 8, classes: int = 4) -> nn.Module:
    return nn.Sequential(nn.Linear(dim, 32), nn.ReLU(), nn.Linear(32, classes))


def not_a_module(dim: int = 8):
    return "a string"


class _Triples(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return torch.zeros(8), 0, "extra"


def broken(kind: str):
    """Datasets a user could get wrong, one kind at a time."""
    good, _ = blobs(num_train=64, num_test=16)
    return {
        "triples": (_Triples(), _Triples()),
        "empty": (TensorDataset(torch.zeros(0, 8), torch.zeros(0, dtype=torch.long)), good),
        "one_split": good,
        "float_targets": (TensorDataset(torch.zeros(64, 8), torch.zeros(64)), good),
        "a_list": ([1, 2, 3], good),
    }[kind]


def per_feature(dim: int = 8, classes: int = 4) -> nn.Module:
    """Logits for each feature, not one set per input: a shape the targets do not have."""
    return nn.Sequential(nn.Unflatten(1, (dim, 1)), nn.Linear(1, classes))
