"""The d2l baselines' MFU, counted as the trainer counts its own.

The trainer writes `mfu`, `peak_flops` and `flops_per_image` into its
summary.json; the baselines do not. For them the benchmark computes the same
three from the same counter and peak (ddp_lab.telemetry.mfu): the FLOPs of one training
image through the baseline's own network (d2l_scratch's LeNet of a parameter
list, data_parallel's ResNet-18), and the measured float32 matmul peak of the
cores (or GPUs) the baseline's one process ran on. Both baselines compute in
float32 on Fashion-MNIST's 1x28x28 images, as d2l's ToTensor gives them.
"""
from __future__ import annotations

import math
from functools import cache

import torch
from torch import nn

from ddp_lab.telemetry import mfu

IMAGE_SHAPE = (1, 28, 28)


class ScratchLeNet(nn.Module):
    """d2l_scratch's LeNet, a function of a parameter list, held as a module so that
    torch's FLOP counter can run it: the same parameters, the same arithmetic."""

    def __init__(self):
        super().__init__()
        from ddp_lab.tools.baselines import d2l_scratch  # torchvision, 2 s: only to count a baseline

        self.lenet = d2l_scratch.lenet
        self.params = nn.ParameterList(d2l_scratch.init_params())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lenet(x, list(self.params))


def baseline_model(name: str) -> nn.Module:
    """The network the baseline `name` trains, built as the baseline builds it (on the CPU)."""
    if name == "d2l_scratch":
        return ScratchLeNet()
    if name == "data_parallel":
        from ddp_lab.tools.baselines import data_parallel  # torchvision, as above

        return data_parallel.get_net([torch.device("cpu")])
    raise ValueError(f"baseline {name!r}: expected d2l_scratch or data_parallel")


@cache
def baseline_flops_per_image(name: str) -> int:
    """Training FLOPs of one image (forward and backward), as ddp_lab.telemetry.mfu counts the trainer's."""
    return mfu.train_flops_per_image(baseline_model(name), IMAGE_SHAPE, torch.float32)


def baseline_peak(summary: dict, threads: int) -> float:
    """The float32 matmul peak of what the baseline ran on: `threads` CPU threads (0: torch's
    default, which the baseline's process had too), or each of its GPUs."""
    device = summary.get("device", "cpu")
    if device == "cpu":
        return mfu.peak_for_run("cpu", torch.float32, 1, 1, threads or torch.get_num_threads())
    gpus = int(summary.get("num_devices") or 1)
    return mfu.peak_for_run(device, torch.float32, gpus, gpus, 0)


def with_mfu(result: dict, name: str, threads: int) -> dict:
    """A baseline run's result with flops_per_image, peak_flops and mfu added (NaN where its
    images/s is unknown), under the keys of the trainer's summary.json."""
    flops = baseline_flops_per_image(name)
    peak = baseline_peak(result, threads)
    rate = result.get("samples_per_sec")
    value = mfu.mfu(flops, rate, peak) if rate is not None and math.isfinite(rate) else math.nan
    return {**result, "flops_per_sample": flops, "peak_flops": peak, "mfu": value,
            "mfu_counted_by": "bench.vs_baseline (ddp_lab.telemetry.mfu)"}
