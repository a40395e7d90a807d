"""Baseline 2: d2l's concise multi-GPU training (ResNet-18 in nn.DataParallel).

    python -m ddp_lab.tools.baselines.data_parallel                   # 10 epochs, batch 256, lr 0.1, all GPUs
    python -m ddp_lab.tools.baselines.data_parallel num_devices=2 data.batch_size=512 lr=0.2   # d2l's 2-GPU run
    python -m ddp_lab.tools.baselines.data_parallel max_steps=20 data.num_workers=4   # quick check, d2l's 4 workers

One process. nn.DataParallel replicates the network onto every GPU at each
forward, scatters the batch, gathers the outputs on GPU 0, and sums the
gradients back into GPU 0's parameters, where one torch.optim.SGD step updates
them. Without a GPU the network runs as the plain module on the CPU (what
nn.DataParallel itself does when no GPU is visible).

Config: conf/baseline_data_parallel.yaml. Output: outputs/baselines/data_parallel/<run id>/
(summary.json, tb/), with the trainer's TensorBoard tags and summary keys.
"""
from __future__ import annotations

from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from torch import nn

from ddp_lab import config
from ddp_lab.models.resnet import resnet18
from ddp_lab.tools.baselines import d2l


def get_devices(num_devices: int) -> list[torch.device]:
    """The first num_devices GPUs (0: all of them), or [cpu] on a machine without one."""
    devices = d2l.try_all_gpus()
    return devices[:num_devices] if num_devices > 0 else devices


def get_net(devices) -> nn.Module:
    """d2l's ResNet-18 with every conv and linear weight drawn from N(0, 0.01^2)."""
    net = resnet18(num_classes=10, in_channels=1, init="d2l")
    if devices[0].type == "cuda":
        # Set up the model on multiple GPUs
        return nn.DataParallel(net, device_ids=devices).to(devices[0])
    return net


def train_batch(net, X, y, trainer, loss, devices):
    """One SGD step on the whole batch; returns (summed loss, correct predictions)."""
    trainer.zero_grad()
    X, y = X.to(devices[0]), y.to(devices[0])
    y_hat = net(X)
    l = loss(y_hat, y)
    l.backward()
    trainer.step()
    with torch.no_grad():
        return l.detach() * y.numel(), (y_hat.argmax(1) == y).sum()


def train(cfg, run_dir: Path) -> dict:
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    train_iter, test_iter = d2l.load_data_fashion_mnist(cfg.data, cfg.seed)
    devices = get_devices(cfg.num_devices)
    net = get_net(devices)
    trainer = torch.optim.SGD(net.parameters(), cfg.lr)
    loss = nn.CrossEntropyLoss()
    sync = "data_parallel" if devices[0].type == "cuda" else "none"
    report = d2l.Report(cfg, run_dir, devices, model="resnet18", sync=sync)
    try:
        for epoch in range(cfg.epochs):
            net.train()
            report.epoch_start()  # the timer runs around the training loop only
            for X, y in report.batches(train_iter):
                loss_sum, correct = train_batch(net, X, y, trainer, loss, devices)
                report.step_done(loss_sum, correct, y.numel())
            report.epoch_end()
            correct, total = d2l.evaluate_accuracy_gpu(net, test_iter, devices[0])
            report.evaluated(epoch, correct, total)
            if report.done:
                break
        return report.finish()
    finally:
        report.close()


def check(cfg) -> None:
    """Refuse bad values; num_devices=0 means every visible GPU."""
    d2l.check_config(cfg, min_devices=0)


@hydra.main(version_base="1.3", config_path=config.CONFIG_PATH, config_name="baseline_data_parallel")
def main(cfg) -> dict:
    check(cfg)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    d2l.refuse_an_earlier_run(run_dir)
    return train(cfg, run_dir)


if __name__ == "__main__":
    main()
