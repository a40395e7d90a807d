"""Dict samples given to the model whole (datasets/keyed.py): values made tensors, `label` as `labels`, a
batch of sequences padded as transformers pads them, and a Hugging Face `datasets` dataset (Arrow, memory-
mapped) taken as any map dataset."""
from __future__ import annotations

import pytest
import torch

from ddp_lab.datasets.keyed import TensorDicts, collate
from ddp_lab.training.data import TorchLoader


def test_values_become_tensors_and_label_is_labels():
    sample = TensorDicts([{"input_ids": [3, 4], "label": 1}])[0]
    assert sorted(sample) == ["input_ids", "labels"] and sample["input_ids"].tolist() == [3, 4]
    assert int(sample["labels"]) == 1


def test_equal_lengths_batch_as_torch_does():
    batch = collate([{"x": torch.ones(3), "labels": torch.tensor(1)}, {"x": torch.zeros(3), "labels": torch.tensor(0)}])
    assert batch["x"].shape == (2, 3) and batch["labels"].tolist() == [1, 0]


def test_a_datasets_dataset_trains_through_the_dataloader(tmp_path):
    datasets = pytest.importorskip("datasets")
    docs = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10, 11]]
    ds = datasets.Dataset.from_dict({"input_ids": docs, "labels": docs, "text": ["a", "b", "c", "d"]})
    ds.save_to_disk(tmp_path / "arrow")
    mapped = datasets.load_from_disk(tmp_path / "arrow").remove_columns("text")  # (Arrow, memory-mapped)
    loader = TorchLoader(TensorDicts(mapped), 2, torch.device("cpu"), 0)
    batches = [x for x, _ in loader.epoch(0)]
    assert batches[0]["input_ids"].tolist() == [[1, 2, 3], [4, 5, 0]]
    assert batches[0]["labels"].tolist() == [[1, 2, 3], [4, 5, -100]]
    assert batches[1]["input_ids"].tolist() == [[6, 7, 8, 9], [10, 11, 0, 0]]
