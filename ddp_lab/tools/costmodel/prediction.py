"""Predict the step time and scaling efficiency of data-parallel training at scale.

A step is compute plus one allreduce of the model's gradients (no overlap
assumed); compute is measured on this machine or given, the allreduce priced
by a formula with fitted or preset constants.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Iterable

import torch

from ddp_lab.config import ConfigError
from ddp_lab.models import build_model, gradient_bytes, load_model_config
from ddp_lab.tools.costmodel.formulas import MODELS, Params


@dataclass(frozen=True)
class Gradient:
    label: str
    nbytes: int
    model_name: str | None  # set when it names a ddp_lab model


def resolve_gradient(entry) -> Gradient:
    """'lenet' / 'gpt' (a conf/model name) or 'my_package.model.net' (any callable, at its default
    arguments) -> its gradient bytes; an integer -> itself."""
    if isinstance(entry, bool):
        raise ConfigError(f"gradients: {entry!r} is neither a model name nor a byte count")
    if isinstance(entry, int) or (isinstance(entry, str) and entry.isdigit()):
        n = int(entry)
        if n <= 0:
            raise ConfigError(f"gradients: {entry!r} must be a positive number of bytes")
        return Gradient(f"bytes_{n}", n, None)
    if "." in str(entry):  # a callable of your own (my_package.model.net), at its default arguments
        net = build_model({"_target_": str(entry)})
        return Gradient(str(entry).rsplit(".", 1)[-1], gradient_bytes(net), None)
    try:
        cfg = load_model_config(str(entry))
    except ValueError as e:
        raise ConfigError(f"gradients: {e}; or give a byte count, e.g. gradients=[44691240]") from None
    return Gradient(str(entry), gradient_bytes(build_model(cfg)), str(entry))


def measure_compute_s(model_name: str, batch_size: int, iters: int, threads: int) -> float:
    """Median seconds of one training step (forward, backward, SGD step) on random 28x28 inputs.

    On this machine's CPU with `threads` torch threads, as one torchrun worker runs.
    """
    cfg = load_model_config(model_name)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        net = build_model(cfg)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        x = torch.randn(batch_size, int(cfg.in_channels), 28, 28)
        y = torch.randint(0, int(cfg.num_classes), (batch_size,))
        loss_fn = torch.nn.CrossEntropyLoss()
        times = []
        for i in range(iters + 1):  # the first step is a warm-up
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss_fn(net(x), y).backward()
            opt.step()
            if i:
                times.append(time.perf_counter() - t0)
        return statistics.median(times)
    finally:
        torch.set_num_threads(old)


@dataclass
class Prediction:
    params_name: str
    params_from: str
    algo: str
    gradient: str
    gradient_bytes: int
    world_size: int
    allreduce_s: float
    compute_s: float

    @property
    def step_s(self) -> float:
        # No overlap of communication with the backward pass is assumed.
        return self.compute_s + self.allreduce_s

    @property
    def efficiency(self) -> float:
        return self.compute_s / self.step_s if self.step_s > 0 else 1.0


def predict(params: Params, algo: str, grad: Gradient, world_sizes: Iterable[int],
            compute_s: float, params_name: str) -> list[Prediction]:
    model = MODELS[algo]
    return [Prediction(params_name, params.source, algo, grad.label, grad.nbytes, p,
                       params.time(model, p, grad.nbytes), compute_s) for p in world_sizes]
