"""What a DataLoader worker may copy of its dataset: the Python objects, not tensors' or arrays' buffers."""
import multiprocessing
import os

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from ddp_lab.datasets import object_bytes as ob
from ddp_lab.telemetry.worker_memory import private_bytes
from tests.workloads import python_blobs

MiB = 2**20


def test_tensors_and_arrays_count_their_objects_not_their_buffers():
    assert ob.object_bytes(TensorDataset(torch.zeros(1 << 20), torch.zeros(1 << 20))) < 4096
    assert ob.object_bytes({"x": np.zeros(1 << 20)}) < 4096
    assert ob.object_bytes(None) == ob.object_bytes(7) == 0  # (the interpreter's own)
    words = np.array([f"sample {i}" for i in range(10_000)], dtype=object)  # (pandas' strings): Python objects
    assert ob.object_bytes(words) > 10_000 * 48


def test_a_long_list_is_counted_from_a_sample_of_its_items(monkeypatch):
    rows = [[float(i)] * (1 + i % 7) for i in range(20_000)]  # items of 7 sizes
    sampled = ob.object_bytes(rows)
    monkeypatch.setattr(ob, "SAMPLED", len(rows))
    exact = ob.object_bytes(rows)
    assert exact > 2 * MiB and abs(sampled / exact - 1) < 0.02


def _read_every_sample(dataset, conn):
    before = private_bytes(os.getpid())
    for i in range(len(dataset)):
        dataset[i]
    conn.send(private_bytes(os.getpid()) - before)


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup") or "fork" not in
                    multiprocessing.get_all_start_methods(), reason="needs Linux's fork and smaps_rollup")
def test_a_forked_reader_of_every_sample_copies_about_what_is_counted():
    """As a DataLoader worker does over the epochs: 0.87-1.09 of the count here, 20k to 300k samples (the reads'
    own allocations write into the pages they share too)."""
    train, _ = python_blobs(num_train=100_000, num_test=10, dim=16)
    counted = ob.object_bytes(train)
    fork = multiprocessing.get_context("fork")
    mine, theirs = fork.Pipe()
    reader = fork.Process(target=_read_every_sample, args=(train, theirs))
    reader.start()
    copied = mine.recv()
    reader.join()
    assert counted > 30 * MiB and 0.8 <= copied / counted <= 1.25, (copied / MiB, counted / MiB)
