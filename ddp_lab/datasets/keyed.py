"""Samples that are dicts (what Hugging Face datasets return), as (input, target) pairs.

`data.input_key` and `data.target_key` name the two entries (ddp_lab.training.data wraps
the splits in KeyedPairs); values that are not tensors yet (lists, numbers,
NumPy arrays: a Hugging Face dataset without `.with_format("torch")`) become
tensors here, so the DataLoader batches them as it batches tensors.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch
from torch.utils.data import Dataset


def keys_of(sample) -> list[str] | None:
    """A dict-like sample's keys, else None."""
    return [str(k) for k in sample.keys()] if isinstance(sample, Mapping) else None


def _tensor(value):
    if isinstance(value, torch.Tensor):
        return value
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):  # (an image object, a string): the check says what it is
        return value


class KeyedPairs(Dataset):
    """(sample[input_key], sample[target_key]) for each dict sample of `dataset`."""

    def __init__(self, dataset, input_key: str, target_key: str):
        self.dataset, self.input_key, self.target_key = dataset, input_key, target_key

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int):
        sample = self.dataset[i]
        return _tensor(sample[self.input_key]), _tensor(sample[self.target_key])
