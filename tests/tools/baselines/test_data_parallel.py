"""data_parallel: d2l's ResNet-18 learns, and a short run writes the trainer's summary."""
import os

import pytest
import torch
from torch import nn

from ddp_lab.tools.baselines import data_parallel as dp
from tests.conftest import failure, read_summary, run_module
from tests.tools.baselines.test_d2l_scratch import TRAINER_KEYS


def test_cpu_fallback_is_the_plain_module_with_d2l_init():
    devices = [torch.device("cpu")]
    torch.manual_seed(0)
    net = dp.get_net(devices)
    assert not isinstance(net, nn.DataParallel)
    convs = [m.weight for m in net.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 20  # stem + 16 in blocks + 3 downsample 1x1
    w = torch.cat([c.flatten() for c in convs])
    assert float(w.detach().std()) == pytest.approx(0.01, rel=0.05)


@pytest.mark.skipif(torch.cuda.device_count() == 0, reason="nn.DataParallel needs a GPU")
def test_gpus_get_data_parallel():
    devices = dp.get_devices(0)
    net = dp.get_net(devices)
    assert isinstance(net, nn.DataParallel) and net.device_ids == [d.index for d in devices]


def test_loss_falls_on_one_batch():
    """A few SGD steps on one batch of the tiny set's pattern (class k: a bar at row 2k+4).

    lr 0.03, not the chapter's 0.1: with 16 images BatchNorm's statistics are
    noisy and N(0, 0.01^2) weights make its effective step large; the recipe's
    0.1 is for batch 256 (the full runs check it).
    """
    torch.manual_seed(0)
    devices = [torch.device("cpu")]
    net = dp.get_net(devices)
    y = torch.arange(16) % 10
    X = torch.rand(16, 1, 28, 28) * 0.25
    for i, k in enumerate(y.tolist()):
        X[i, 0, 2 * k + 4: 2 * k + 6, 4:24] = 1.0
    trainer = torch.optim.SGD(net.parameters(), 0.03)
    loss = nn.CrossEntropyLoss()
    losses = []
    threads = torch.get_num_threads()
    torch.set_num_threads(min(2, os.cpu_count() or 1))  # ResNet-18's 4 steps: 6 s on one Zen 1 core
    try:
        for _ in range(4):
            loss_sum, correct = dp.train_batch(net, X, y, trainer, loss, devices)
            losses.append(loss_sum.item() / 16)
    finally:
        torch.set_num_threads(threads)
    assert losses[0] == pytest.approx(2.3026, abs=0.05)  # N(0, 0.01^2) head: uniform outputs
    assert losses[0] > losses[1] > losses[2] > losses[3], losses
    assert losses[3] < losses[0] - 0.5, losses


@pytest.mark.system
def test_end_to_end_run(tiny_fmnist, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_module("ddp_lab.tools.baselines.data_parallel", [
        f"data.root={tiny_fmnist}", f"data.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={run_dir}",
        "data.batch_size=32", "data.num_workers=0", "epochs=2", "max_steps=3", "threads=1",
        "warmup_steps=1", "log_every=1"], nproc=0)
    assert proc.returncode == 0, failure(proc)
    summary = read_summary(run_dir)
    assert TRAINER_KEYS | {"peak_mem_mb", "num_devices"} <= set(summary)
    # The chapter's program takes every GPU there is (nn.DataParallel), else the CPU alone.
    sync, device = ("data_parallel", "cuda") if torch.cuda.device_count() else ("none", "cpu")
    assert (summary["model"], summary["sync"], summary["device"], summary["global_batch"]) == (
        "resnet18", sync, device, 32)
    assert summary["steps"] == 3 and summary["epochs"] == 1  # max_steps ends the run
    assert summary["measured_steps"] == 2
    assert summary["test_total"] == 203 and summary["samples_per_sec"] > 0
    assert summary["peak_mem_mb"] > 50
