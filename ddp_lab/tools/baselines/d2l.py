"""The few `d2l` helpers the baselines use, plus their reporting.

The d2l book's package provides `try_gpu`, `load_data_fashion_mnist`, `sgd`,
`Timer` and `evaluate_accuracy_gpu`; here they are written out so the
baselines read like the chapter (`d2l.sgd(param, lr, batch_size)`), without
depending on the d2l package. `Report` replaces d2l's Animator: it writes the
trainer's TensorBoard tags and summary.json keys, so a baseline run appears in
the same dashboards and tables as `ddp_lab.train`.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

from ddp_lab.datasets.fashion_mnist_files import locate_fashion_mnist
from ddp_lab.telemetry.meter import Clock, Throughput
from ddp_lab.telemetry.metrics import RunLogger, epoch_line, final_line, peak_memory_mb


@dataclass
class BaselineData:
    root: Optional[str] = None
    cache_dir: str = MISSING
    download: bool = MISSING
    batch_size: int = MISSING
    num_workers: int = MISSING


@dataclass
class BaselineConfig:
    """Types of a baseline's config keys (values and comments: conf/baseline_*.yaml)."""
    data: BaselineData = MISSING
    epochs: int = MISSING
    lr: float = MISSING
    num_devices: int = MISSING
    max_steps: int = MISSING
    warmup_steps: int = MISSING
    log_every: int = MISSING
    threads: int = MISSING
    seed: int = MISSING


# Hydra then rejects unknown keys and wrong types (epochs=ten) with a clear message.
ConfigStore.instance().store(name="baseline_schema", node=BaselineConfig)


def check_config(cfg, min_devices: int, min_batch: int = 1) -> None:
    """Refuse a bad value before any work: one line on stderr, exit status 2 (as the trainer)."""
    for key, value, low, why in (
            ("epochs", cfg.epochs, 1, ""), ("lr", cfg.lr, 0, ""),
            ("num_devices", cfg.num_devices, min_devices, ""),
            ("max_steps", cfg.max_steps, 0, " (0: no cap)"), ("warmup_steps", cfg.warmup_steps, 0, ""),
            ("log_every", cfg.log_every, 1, ""), ("threads", cfg.threads, 0, " (0: torch's default)"),
            ("data.batch_size", cfg.data.batch_size, min_batch,
             f" (every one of the {cfg.num_devices} devices needs a share of each batch)"
             if min_batch > 1 else ""),
            ("data.num_workers", cfg.data.num_workers, 0, "")):
        if value < low:
            print(f"ddp_lab: error: {key}={value} must be >= {low}{why}", file=sys.stderr)
            raise SystemExit(2)


def refuse_an_earlier_run(run_dir: Path) -> None:
    """A reused hydra.run.dir must not overwrite an earlier run's summary and event files."""
    if (run_dir / "summary.json").exists():
        print(f"ddp_lab: error: hydra.run.dir={run_dir} already holds an earlier run "
              "(summary.json); choose another hydra.run.dir (or leave it out: a new folder "
              "per run)", file=sys.stderr)
        raise SystemExit(2)


def try_gpu(i: int = 0) -> torch.device:
    """GPU i if there is one, else the CPU."""
    if torch.cuda.device_count() >= i + 1:
        return torch.device(f"cuda:{i}")
    return torch.device("cpu")


def try_all_gpus() -> list[torch.device]:
    """Every visible GPU, or [cpu] when there is none."""
    return [torch.device(f"cuda:{i}") for i in range(torch.cuda.device_count())] or [torch.device("cpu")]


def synchronize(devices) -> None:
    """Wait for queued GPU work (d2l calls torch.cuda.synchronize() after every batch)."""
    for d in devices:
        if d.type == "cuda":
            torch.cuda.synchronize(d)


def load_data_fashion_mnist(data, seed: int):
    """d2l's loaders: torchvision FashionMNIST, ToTensor ([0, 1] pixels), DataLoader(shuffle=True).

    `data` is the config's data group (root, cache_dir, download, batch_size,
    num_workers); the files are found as ddp_lab.training.data finds them.
    """
    root = str(locate_fashion_mnist(data.root, data.download, data.cache_dir))
    trans = transforms.ToTensor()
    mnist_train = datasets.FashionMNIST(root, train=True, transform=trans, download=data.download)
    mnist_test = datasets.FashionMNIST(root, train=False, transform=trans, download=data.download)
    shuffle = torch.Generator().manual_seed(seed)
    return (DataLoader(mnist_train, data.batch_size, shuffle=True, generator=shuffle,
                       num_workers=data.num_workers),
            DataLoader(mnist_test, data.batch_size, shuffle=False, num_workers=data.num_workers))


def sgd(params, lr: float, batch_size: int) -> None:
    """Minibatch SGD on summed losses: param -= lr * grad / batch_size, then zero the grad."""
    with torch.no_grad():
        for param in params:
            param -= lr * param.grad / batch_size
            param.grad.zero_()


@torch.no_grad()
def evaluate_accuracy_gpu(net, data_iter, device) -> tuple[int, int]:
    """(correct, total) over data_iter, computed on `device` (d2l returns their ratio)."""
    if isinstance(net, torch.nn.Module):
        net.eval()
    correct = torch.zeros((), dtype=torch.int64, device=device)
    total = 0
    for X, y in data_iter:
        X, y = X.to(device), y.to(device)
        correct += (net(X).argmax(1) == y).sum()
        total += y.numel()
    return int(correct), total


class Timer:
    """d2l's Timer: start()/stop() around the training loop of each epoch."""

    def __init__(self):
        self.times: list[float] = []

    def start(self) -> None:
        self.tik = time.perf_counter()

    def stop(self) -> float:
        self.times.append(time.perf_counter() - self.tik)
        return self.times[-1]

    def avg(self) -> float:
        return sum(self.times) / len(self.times)


class Report:
    """What a baseline reports, under the trainer's names.

    Per epoch: loss/train, acc/train, acc/test, perf/* and lr in TensorBoard;
    at the end summary.json with the trainer's keys (plus peak_mem_mb and
    num_devices). sec_per_epoch is d2l's timer.avg() (training loop only);
    samples_per_sec leaves out the first `warmup_steps` steps and evaluation,
    exactly as the trainer's Throughput does.
    """

    def __init__(self, cfg, run_dir: Path, devices, model: str, sync: str):
        self.cfg, self.devices, self.model, self.sync = cfg, list(devices), model, sync
        self.log = RunLogger(Path(run_dir), is_main=True)
        self.clock = Clock(self.devices[0])
        self.throughput = Throughput(self.clock, cfg.warmup_steps)
        self.timer = Timer()
        self.step = 0
        self.data_seconds = 0.0
        self.last: dict = {}
        self.log.config(cfg)

    @property
    def done(self) -> bool:
        return 0 < self.cfg.max_steps <= self.step

    def batches(self, data_iter):
        """The epoch's batches, stopping at max_steps; time spent waiting on data is counted."""
        it = iter(data_iter)
        while not self.done:
            t0 = time.perf_counter()
            batch = next(it, None)
            self.data_seconds += time.perf_counter() - t0
            if batch is None:
                return
            yield batch

    def epoch_start(self) -> None:
        self.sums = torch.zeros(3, dtype=torch.float64, device=self.devices[0])  # loss sum, correct, n
        self.images0, self.seconds0 = self.throughput.images, self.throughput.seconds
        self.timer.start()
        self.throughput.resume()

    def step_done(self, loss_sum: torch.Tensor, correct: torch.Tensor, n: int) -> None:
        """After one minibatch: its summed loss and correct count (tensors, no sync here)."""
        self.sums += torch.stack([loss_sum.detach().double(), correct.double(),
                                  torch.tensor(float(n), dtype=torch.float64, device=self.sums.device)])
        self.step += 1
        self.throughput.step_done(n)
        if self.step % self.cfg.log_every == 0:
            self.log.scalars({"loss/train_step": float(loss_sum) / n, "lr": self.cfg.lr}, self.step)

    def epoch_end(self) -> float:
        self.throughput.pause()
        self.synchronize()
        return self.timer.stop()

    def synchronize(self) -> None:
        synchronize(self.devices)

    def evaluated(self, epoch: int, correct: int, total: int) -> None:
        loss_sum, right, n = self.sums.tolist()
        images = self.throughput.images - self.images0
        window = self.throughput.seconds - self.seconds0
        rate = images / window if window > 0 else float("nan")
        metrics = {
            "loss/train": loss_sum / max(n, 1), "acc/train": right / max(n, 1),
            "acc/test": correct / total,
            "perf/samples_per_sec": rate, "perf/samples_per_sec_per_rank": rate,
            "perf/step_ms": self.throughput.step_ms,
            "perf/data_ms": 1000 * self.data_seconds / max(self.step, 1),
            "perf/epoch_s": self.timer.times[-1], "lr": self.cfg.lr,
        }
        self.log.scalars(metrics, self.step)
        self.log.print(epoch_line(epoch, self.cfg.epochs, metrics))
        self.last = {**metrics, "test_correct": correct, "test_total": total, "epochs": epoch + 1}

    def finish(self) -> dict:
        last, cfg = self.last, self.cfg
        rate = self.throughput.per_sec
        summary = {
            "test_acc": last["acc/test"], "test_correct": last["test_correct"],
            "test_total": last["test_total"], "train_loss": last["loss/train"],
            "train_acc": last["acc/train"], "samples_per_sec": rate,
            "samples_per_sec_per_rank": rate, "sec_per_epoch": self.timer.avg(),
            "step_ms": self.throughput.step_ms,
            "data_ms": 1000 * self.data_seconds / max(self.step, 1),
            "epochs": last["epochs"], "steps": self.step, "world_size": 1, "backend": "none",
            "device": self.devices[0].type, "model": self.model, "sync": self.sync,
            "global_batch": cfg.data.batch_size, "amp": "off", "seed": cfg.seed,
            "measured_steps": self.throughput.steps,
            # the trainer's communication keys; a baseline's copies/allreduce are not timed apart
            "comm_timing": "unmeasured", "comm_ms_per_step": math.nan, "comm_frac": math.nan,
            "num_devices": len(self.devices), "peak_mem_mb": peak_memory_mb(self.devices[0]),
        }
        # The trainer's HParams names, so a sweep of baselines and trainer runs lines up.
        hp = OmegaConf.create({
            "seed": cfg.seed, "model": {"name": self.model}, "sync": {"mode": self.sync},
            "data": {"batch_size": cfg.data.batch_size, "num_workers": cfg.data.num_workers},
            "optim": {"lr": cfg.lr},
            "trainer": {"epochs": cfg.epochs, "max_steps": cfg.max_steps, "threads": cfg.threads},
        })
        self.log.hparams(hp, 1, "none", {k: summary[k] for k in ("test_acc", "train_loss", "samples_per_sec")})
        self.log.summary(summary)
        self.log.print(final_line(summary) + f" [{self.model}, {self.sync}, {len(self.devices)} device(s)]")
        return summary

    def close(self) -> None:
        self.log.close()
