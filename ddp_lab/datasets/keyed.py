"""Samples that are dicts (what Hugging Face datasets return), as (input, target) pairs.

`data.input_key` and `data.target_key` name the two entries (ddp_lab.training.data wraps
the splits in KeyedPairs); values that are not tensors yet (lists, numbers,
NumPy arrays: a Hugging Face dataset without `.with_format("torch")`) become
tensors here, so the DataLoader batches them as it batches tensors.

Without those keys, dict samples go to the model whole, as keyword arguments
(TensorDicts; ddp_lab.models.calling), and `collate` pads a batch of sequences of
different lengths on the right: labels with -100 (not scored), attention_mask with 0
(not attended), every other key with 0.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch
from torch.utils.data import Dataset, default_collate

PADS = {"labels": -100, "attention_mask": 0}  # what a key is padded with (0 for the rest)
AS_LABELS = ("label", "label_ids")  # taken as `labels`, as transformers' default data collator does


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


class TensorDicts(Dataset):
    """Each dict sample of `dataset` with its values as tensors (the model takes them by keyword), a
    `label` or `label_ids` key as `labels`."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> dict:
        sample = {str(k): _tensor(v) for k, v in self.dataset[i].items()}
        for key in AS_LABELS:
            if key in sample and "labels" not in sample:
                sample["labels"] = sample.pop(key)
        return sample


def collate(samples: list):
    """torch's default batching, but dict samples whose sequences differ in length are padded on the
    right to the longest of the batch (labels with -100, attention_mask with 0, the rest with 0)."""
    if not (samples and isinstance(samples[0], Mapping)):
        return default_collate(samples)
    out = {}
    for key in samples[0]:
        values = [s[key] for s in samples]
        if isinstance(values[0], torch.Tensor) and values[0].dim() >= 1 and len({v.shape for v in values}) > 1:
            longest = max(v.shape[0] for v in values)
            padded = values[0].new_full((len(values), longest, *values[0].shape[1:]), PADS.get(key, 0))
            for row, v in zip(padded, values):
                row[:v.shape[0]] = v
            out[key] = padded
        else:
            out[key] = default_collate(values)
    return out
