"""What every peer loop shares, so that the race differs only in the trainer: the model, data,
optimizer and loss ddp_lab's own config makes of the same overrides, and the step clock.

A peer composes ddp_lab's config from the race's overrides (model=gpt_small data=text ...), builds
the module with ddp_lab's own builder from the run's seed, the two datasets, and the optimizer the
optim group names (its lr, weight decay, momentum); everything after that is the peer's own:
DistributedSampler and DataLoader, the wrapper, autocast, clipping, the step. On a machine with
GPUs each rank takes the GPU of its local rank (NCCL), as ddp_lab does; else the CPU (gloo).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ddp_lab.config import targets
from ddp_lab.telemetry.profiling import StepProfiler


def arguments(prog: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=prog, description="one peer's training, for the race "
                                "(python -m ddp_lab.tools.bench.peers)")
    p.add_argument("--steps", type=int, default=40, help="optimizer steps in all")
    p.add_argument("--warmup", type=int, default=10, help="steps left out of the step time")
    p.add_argument("--out", type=Path, required=True, help="rank 0 writes its result here (JSON)")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="record this many steps after the warm-up with torch.profiler, as ddp_lab's "
                        "trainer.profile does (profile/rank<N>.json and .txt beside --out)")
    p.add_argument("overrides", nargs="*", help="ddp_lab's overrides: the model, data, optim, trainer.amp")
    return p.parse_args()


def compose(overrides: list[str]):
    from ddp_lab.tools.costmodel.will_it_fit import compose as compose_train  # ddp_lab's checks too
    return compose_train(overrides)


def build(cfg):
    """(model, train set, optimizer factory, loss, bf16?) from ddp_lab's config, the model from cfg.seed."""
    from ddp_lab.models.build import build_model
    from ddp_lab.training.data import build_datasets

    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model)
    train, _ = build_datasets(cfg.data)
    opt = {k: cfg.optim[k] for k in ("lr", "weight_decay", "momentum") if k in cfg.optim}

    def optimizer(params):
        return targets.build("optim", {"_target_": cfg.optim._target_, **opt}, params=params)

    return model, train, optimizer, cross_entropy, cfg.trainer.amp == "bf16"


def cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A classifier's (N, C) or a language model's (N, T, V) logits against their targets."""
    return F.cross_entropy(logits.flatten(0, -2).float(), y.flatten())


def device() -> torch.device:
    """This rank's GPU (its local rank's) where CUDA is, else the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(dev)
    return dev


def per_rank_batch(cfg) -> int:
    return cfg.data.batch_size // int(os.environ.get("WORLD_SIZE", 1))


class StepClock:
    """ddp_lab's measure (summary.json's step_ms): the wall time of the steps after the warm-up ones,
    queued GPU work included at both ends (as ddp_lab's Clock)."""

    def __init__(self, warmup: int, profile_steps: int = 0, out: Path | None = None):
        self.warmup, self.done, self.t0 = warmup, 0, None
        # the same timeline and table as ddp_lab's trainer.profile=true with trainer.profile_wait=warmup
        self.profiler = StepProfiler(profile_steps > 0, warmup, max(1, profile_steps),
                                     out.parent if out else Path("."), int(os.environ.get("RANK", 0)),
                                     torch.cuda.is_available())

    @staticmethod
    def now() -> float:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter()

    def step_done(self) -> None:
        self.done += 1
        self.profiler.step()
        if self.done == self.warmup:
            self.t0 = self.now()

    def write(self, out: Path, loss: torch.Tensor, **extra) -> None:
        self.profiler.close()
        measured = self.done - self.warmup
        step_ms = 1000 * (self.now() - self.t0) / measured if measured > 0 else float("nan")
        if int(os.environ.get("RANK", 0)) == 0:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps({"step_ms": step_ms, "steps": self.done, "loss": float(loss.detach()), **extra}))


def batches(loader, sampler, steps: int):
    """(x, y) for `steps` steps, epoch after epoch, each epoch shuffled by the sampler."""
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        for batch in loader:
            yield batch
            steps -= 1
            if steps == 0:
                return
        epoch += 1
