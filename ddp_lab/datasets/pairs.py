"""TensorPairs: a dataset held as two tensors, which ddp_lab's device loader can
batch by indexing (no per-sample Python, no worker processes).

A dataset callable (`data._target_`) may return any torch Dataset of
(input, target) pairs; returning TensorPairs (or a TensorDataset of two
tensors) lets `data.loader=auto` keep the whole split on the training device.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch.utils.data import Dataset, TensorDataset


class TensorPairs(Dataset):
    """inputs[i], targets[i] for i < len; `transform` turns a batch of stored inputs
    (e.g. uint8 pixels) into what the model takes, on the device, once per batch."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor,
                 transform: Callable[[torch.Tensor], torch.Tensor] | None = None):
        if len(inputs) != len(targets):
            raise ValueError(f"{len(inputs)} inputs but {len(targets)} targets: each input needs its target")
        self.inputs, self.targets, self.transform = inputs, targets, transform

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int):
        x = self.inputs[i:i + 1]
        return (self.transform(x) if self.transform else x)[0], self.targets[i]

    def batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The samples at `idx` (a tensor on the inputs' device), as the model takes them."""
        x = self.inputs.index_select(0, idx)
        return (self.transform(x) if self.transform else x), self.targets.index_select(0, idx)

    def to(self, device: torch.device) -> "TensorPairs":
        return TensorPairs(self.inputs.to(device), self.targets.to(device), self.transform)

    @property
    def nbytes(self) -> int:
        return self.inputs.nbytes + self.targets.nbytes


def as_tensor_pairs(ds) -> TensorPairs | None:
    """`ds` as TensorPairs where it is held as two tensors, else None (a DataLoader's)."""
    if isinstance(ds, TensorPairs):
        return ds
    if isinstance(ds, TensorDataset) and len(ds.tensors) == 2:
        return TensorPairs(*ds.tensors)
    return None


class ScaledPixels:
    """uint8 pixels to floats: /255, then (x - mean) / std (torchvision's ToTensor and Normalize)."""

    def __init__(self, mean: float = 0.0, std: float = 1.0):
        self.mean, self.std = mean, std

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.float().div_(255).sub_(self.mean).div_(self.std)
