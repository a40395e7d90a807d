"""A rank's DataLoader workers' memory: each worker's private pages, the largest sum sampled."""
import os
import subprocess
import sys

import pytest
import torch

from ddp_lab.telemetry.worker_memory import WorkerMemory, private_bytes
from ddp_lab.training.data import build_datasets, build_loaders

MiB = 2**20
needs_proc = pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="needs Linux's smaps_rollup")

# a process that writes 64 MiB of its own, says so, and waits
_HOLDS_64_MIB = "import sys; b = bytearray(b'x') * (64 << 20); print('ready', flush=True); sys.stdin.read()"


@needs_proc
def test_the_pages_a_process_wrote_are_its_own_and_a_gone_one_holds_none():
    proc = subprocess.Popen([sys.executable, "-c", _HOLDS_64_MIB], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        held = private_bytes(proc.pid)
        assert 64 * MiB <= held < 64 * MiB + 40 * MiB, held / MiB  # (the interpreter's own: a few MiB)
        memory = WorkerMemory(lambda: [proc.pid])
        assert memory.sample() == memory.peak_bytes >= 64 * MiB
    finally:
        proc.kill()
        proc.wait()
    assert private_bytes(proc.pid) == 0
    assert memory.sample() == 0 and memory.peak_bytes >= 64 * MiB  # (the largest sampled stays)


@needs_proc
def test_a_loaders_workers_are_known_once_started_and_measured(tiny_fmnist, tmp_path, compose_train):
    cfg = compose_train([f"data.root={tiny_fmnist}", f"data.cache_dir={tmp_path}", "data.loader=dataloader",
                         "data.num_workers=2"]).data
    train, _ = build_loaders(cfg, *build_datasets(cfg), 0, 2, torch.device("cpu"), seed=0)
    assert train.worker_pids == []  # (started with the first batch)
    batches = train.epoch(0)
    next(batches)
    pids = train.worker_pids
    assert len(set(pids)) == 2 and os.getpid() not in pids
    for pid in pids:  # the rank's own children
        with open(f"/proc/{pid}/stat") as f:
            assert int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid()
    memory = WorkerMemory(lambda: train.worker_pids)
    assert memory.sample() > 0
    del batches
