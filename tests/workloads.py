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


def linear_regression(num_train: int = 512, num_test: int = 128, dim: int = 8, noise: float = 0.1, seed: int = 0):
    """y = x . w + noise, float targets: (train, test) TensorDatasets."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(dim, generator=g)
    out = []
    for n in (num_train, num_test):
        x = torch.randn(n, dim, generator=g)
        out.append(TensorDataset(x, x @ w + noise * torch.randn(n, generator=g)))
    return out[0], out[1]


def regressor(dim: int = 8) -> nn.Module:
    return nn.Linear(dim, 1)


class _Dicts(Dataset):
    """Samples as a Hugging Face dataset without a torch format returns them: a dict of lists and ints."""

    def __init__(self, pairs):
        self.pairs = pairs

    def __len__(self):
        return len(self.pairs)

    def __getitem__(self, i):
        x, y = self.pairs[i]
        return {"features": x.tolist(), "label": int(y), "id": i}


def dict_blobs(num_train: int = 512, num_test: int = 128):
    """blobs() with each sample a dict: (train, test)."""
    train, test = blobs(num_train, num_test)
    return _Dicts(train), _Dicts(test)


def bn_conv(classes: int = 10) -> nn.Module:
    """A small convolutional net with BatchNorm for 28 x 28 grey images (Fashion-MNIST): floating buffers."""
    return nn.Sequential(nn.Conv2d(1, 8, 5, stride=2), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2),
                         nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 5 * 5, classes))


def dead_relus(dim: int = 8, classes: int = 4) -> nn.Module:
    """linear() with every hidden unit dead from the start, as a learning rate too high leaves
    a network: it can learn only the class frequencies (its last bias), and stays at chance."""
    net = linear(dim, classes)
    nn.init.constant_(net[0].bias, -100.0)
    return net


class _Hidden(nn.Module):
    """A forward by keyword that returns neither a loss nor logits (a base model without its head)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 4)

    def forward(self, input_ids, labels=None):
        return {"hidden": self.emb(input_ids)}


def hidden_states_only() -> nn.Module:
    return _Hidden()


class _Rows(Dataset):
    """Samples held as Python objects, as parsed data often is: a list of (list of floats, label)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.rows = list(zip(x.tolist(), y.tolist()))

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        features, label = self.rows[i]
        return torch.tensor(features), label


def python_blobs(num_train: int = 1024, num_test: int = 256, dim: int = 8, classes: int = 4, seed: int = 0):
    """blobs, each split held as Python objects (_Rows), not tensors."""
    return tuple(_Rows(*split.tensors) for split in blobs(num_train, num_test, dim, classes, seed))
