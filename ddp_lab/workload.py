"""What a run trains on: the datasets `data._target_` builds, the task their
targets imply, checked against the model before any step, and each rank's
loaders over them."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ddp_lab.data import build_datasets, build_loaders, example
from ddp_lab.datasets import as_tensor_pairs
from ddp_lab.distributed import DistEnv
from ddp_lab.models import check_fits_data
from ddp_lab.tasks import Task, choose_task

log = logging.getLogger("ddp_lab")


@dataclass
class Workload:
    train_loader: object
    test_loader: object
    task: Task
    input_example: torch.Tensor   # one sample's input, for the FLOP count
    targets_per_sample: int       # 1 for classification, the sequence length for a language model
    channels_last: bool           # the images' layout (off for other inputs)

    def loaders(self) -> tuple:
        return self.train_loader, self.test_loader


def num_classes(train) -> int:
    """The largest target + 1: the classes (or tokens) the model must predict."""
    pairs = as_tensor_pairs(train)
    return int(pairs.targets.max()) + 1 if pairs is not None else int(example(train)[1].max()) + 1


def build_workload(cfg, env: DistEnv) -> Workload:
    train, test = build_datasets(cfg.data)
    x, y = example(train)
    task = choose_task(cfg.data.task, y)
    check_fits_data(cfg, x, y, task, num_classes(train))
    channels_last = cfg.trainer.channels_last and x.dim() == 3  # memory layouts are for images
    train_loader, test_loader = build_loaders(cfg.data, train, test, env.rank, env.world_size, env.device,
                                              cfg.seed, channels_last)
    log.info("data: %d training and %d held-out samples of %s -> %s (%s), %s loader", len(train), len(test),
             list(x.shape), list(y.shape) or "a class", task.name, type(train_loader).__name__)
    return Workload(train_loader, test_loader, task, x, max(y.numel(), 1), channels_last)
