"""Baseline 1: d2l's multi-GPU training from scratch (LeNet, hand-written allreduce).

    python -m ddp_lab.tools.baselines.d2l_scratch                    # 10 epochs, batch 256, lr 0.2, 2 devices
    python -m ddp_lab.tools.baselines.d2l_scratch num_devices=1 epochs=2
    python -m ddp_lab.tools.baselines.d2l_scratch max_steps=50 data.num_workers=4   # a quick check, d2l's 4 workers

One process holds a copy of the parameters per device. Each minibatch is
scattered over the devices, every device computes the loss of its shard and
backpropagates, `allreduce` sums the gradients onto device 0 and copies the
sum back, and every device takes the same SGD step. On a machine with fewer
GPUs than `num_devices`, `d2l.try_gpu` falls back to the CPU, so on a CPU-only
machine every copy lives on the CPU (the arithmetic is the same, only slower).

Config: conf/baseline_d2l_scratch.yaml. Output: outputs/baselines/d2l_scratch/<run id>/
(summary.json, tb/), with the trainer's TensorBoard tags and summary keys.
"""
from __future__ import annotations

from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from torch import nn
from torch.nn import functional as F

from ddp_lab import config
from ddp_lab.tools.baselines import d2l


def init_params(scale: float = 0.01) -> list[torch.Tensor]:
    """LeNet's weights from N(0, scale^2), biases zero: w1, b1, ..., w4, b4."""
    w1 = torch.randn(size=(20, 1, 3, 3)) * scale
    b1 = torch.zeros(20)
    w2 = torch.randn(size=(50, 20, 5, 5)) * scale
    b2 = torch.zeros(50)
    w3 = torch.randn(size=(800, 128)) * scale
    b3 = torch.zeros(128)
    w4 = torch.randn(size=(128, 10)) * scale
    b4 = torch.zeros(10)
    return [w1, b1, w2, b2, w3, b3, w4, b4]


def lenet(X, params):
    h1_conv = F.conv2d(input=X, weight=params[0], bias=params[1])
    h1_activation = F.relu(h1_conv)
    h1 = F.avg_pool2d(input=h1_activation, kernel_size=(2, 2), stride=(2, 2))
    h2_conv = F.conv2d(input=h1, weight=params[2], bias=params[3])
    h2_activation = F.relu(h2_conv)
    h2 = F.avg_pool2d(input=h2_activation, kernel_size=(2, 2), stride=(2, 2))
    h2 = h2.reshape(h2.shape[0], -1)
    h3_linear = torch.mm(h2, params[4]) + params[5]
    h3 = F.relu(h3_linear)
    y_hat = torch.mm(h3, params[6]) + params[7]
    return y_hat


loss = nn.CrossEntropyLoss(reduction="none")


def get_params(params, device):
    """A copy of the parameters on `device`, each one requiring gradients."""
    # copy=True: on the CPU fallback .to() would hand back the very same tensors,
    # and the "devices" would share (and double-count) their gradients.
    new_params = [param.to(device, copy=True) for param in params]
    for param in new_params:
        param.requires_grad_()
    return new_params


def allreduce(data):
    """Sum the tensors onto data[0], then copy the sum back to every other one."""
    for i in range(1, len(data)):
        data[0][:] += data[i].to(data[0].device)
    for i in range(1, len(data)):
        data[i][:] = data[0].to(data[i].device)


def split_batch(X, y, devices):
    """Split X and y into one shard per device (nn.parallel.scatter when all are GPUs)."""
    assert X.shape[0] == y.shape[0]
    if all(d.type == "cuda" for d in devices):
        return (nn.parallel.scatter(X, devices),
                nn.parallel.scatter(y, devices))
    # scatter is CUDA-only; on the CPU fallback, chunk the batch as scatter does.
    return ([x.to(d) for x, d in zip(X.chunk(len(devices)), devices)],
            [t.to(d) for t, d in zip(y.chunk(len(devices)), devices)])


def train_batch(X, y, device_params, devices, lr):
    """One minibatch on all devices; returns (summed loss, correct predictions) on device 0."""
    X_shards, y_shards = split_batch(X, y, devices)
    # Compute the loss on each device separately
    y_hats = [lenet(X_shard, device_W) for X_shard, device_W in zip(X_shards, device_params)]
    ls = [loss(y_hat, y_shard).sum() for y_hat, y_shard in zip(y_hats, y_shards)]
    for l in ls:  # Backpropagation is performed separately on each device
        l.backward()
    # Sum all gradients from each device and broadcast them to all devices
    with torch.no_grad():
        for i in range(len(device_params[0])):
            allreduce([device_params[c][i].grad for c in range(len(devices))])
    # The model parameters are updated separately on each device
    for param in device_params:
        d2l.sgd(param, lr, X.shape[0])  # Here, we use a full-size batch
    with torch.no_grad():
        correct = sum((y_hat.argmax(1) == y_shard).sum().to(devices[0])
                      for y_hat, y_shard in zip(y_hats, y_shards))
        return sum(l.detach().to(devices[0]) for l in ls), correct


def train(cfg, run_dir: Path) -> dict:
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    params = init_params()
    train_iter, test_iter = d2l.load_data_fashion_mnist(cfg.data, cfg.seed)
    devices = [d2l.try_gpu(i) for i in range(cfg.num_devices)]
    # Copy the model parameters to num_devices devices
    device_params = [get_params(params, d) for d in devices]
    report = d2l.Report(cfg, run_dir, devices, model="lenet_scratch", sync="d2l_allreduce")
    try:
        for epoch in range(cfg.epochs):
            report.epoch_start()  # the timer runs around the training loop only
            for X, y in report.batches(train_iter):
                # Perform multi-device training for a single minibatch
                loss_sum, correct = train_batch(X, y, device_params, devices, cfg.lr)
                d2l.synchronize(devices)
                report.step_done(loss_sum, correct, X.shape[0])
            report.epoch_end()
            # Evaluate the model on device 0
            correct, total = d2l.evaluate_accuracy_gpu(
                lambda x: lenet(x, device_params[0]), test_iter, devices[0])
            report.evaluated(epoch, correct, total)
            if report.done:
                break
        return report.finish()
    finally:
        report.close()


def check(cfg) -> None:
    """Refuse bad values; every device gets a share of each batch."""
    d2l.check_config(cfg, min_devices=1, min_batch=max(1, cfg.num_devices))


@hydra.main(version_base="1.3", config_path=config.CONFIG_PATH, config_name="baseline_d2l_scratch")
def main(cfg) -> dict:
    check(cfg)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    d2l.refuse_an_earlier_run(run_dir)
    return train(cfg, run_dir)


if __name__ == "__main__":
    main()
