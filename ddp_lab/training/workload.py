"""What a run trains on: the datasets `data._target_` builds, the task their
targets imply, checked against the model before any step, and each rank's
loaders over them."""
from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch

from ddp_lab.config import ConfigError
from ddp_lab.datasets import as_tensor_pairs
from ddp_lab.distributed import DistEnv
from ddp_lab.models import check_fits_data, check_takes_dicts
from ddp_lab.training.data import build_datasets, build_loaders, example, worker_copies
from ddp_lab.training.tasks import Task, build_loss, choose_task

log = logging.getLogger("ddp_lab")


@dataclass
class Workload:
    train_loader: object
    test_loader: object
    task: Task
    input_example: torch.Tensor | dict  # one sample's input (a dict batch's: the dict), for the FLOP count
    target_example: torch.Tensor  # its target, for the memory estimate
    targets_per_sample: int       # 1 for classification, the sequence length for a language model
    channels_last: bool           # the images' layout (off for other inputs)
    classes: int = 0              # the largest target + 1 (0: regression, no classes)

    @property
    def loader_workers(self) -> int:
        """The DataLoader worker processes this rank runs: its loaders' (persistent), none for the device loader."""
        return sum(getattr(getattr(loader, "loader", None), "num_workers", 0)
                   for loader in (self.train_loader, self.test_loader))

    @property
    def loader_copies(self) -> int:
        """The bytes those workers may copy of their datasets' Python objects, together (data.worker_copies)."""
        loaders = [getattr(loader, "loader", None) for loader in (self.train_loader, self.test_loader)]
        return sum(worker_copies(x.num_workers, [x.dataset]) for x in loaders if x is not None)

    def loader_worker_pids(self) -> list[int]:
        """Those of them running now."""
        return [p for loader in (self.train_loader, self.test_loader) for p in getattr(loader, "worker_pids", [])]


def num_classes(train) -> int:
    """The largest target + 1: the classes (or tokens) the model must predict."""
    pairs = as_tensor_pairs(train)
    return int(pairs.targets.max()) + 1 if pairs is not None else int(example(train)[1].max()) + 1


def build_workload(data, env: DistEnv, seed: int, *, model, loss=None, grad_accum: int = 1,
                   channels_last: bool = False, part: tuple[int, int] | None = None) -> Workload:
    """data's datasets, loaders and task (`part`: this rank's part of the training set, and how many, where
    they are not the world's: data.build_loaders). The rest are the checks': the model (its group) must take the
    data, trainer.loss (`loss`) its outputs, and each rank's shard must hold trainer.grad_accum batches."""
    train, test = build_datasets(data)
    x, y = example(train)
    task = choose_task(data.task, y, build_loss(loss))
    classes = num_classes(train) if task.correct_name else 0
    if isinstance(x, Mapping):  # the model takes the dict by keyword and brings its own loss
        task = replace(task, own_loss=True, shift=check_takes_dicts(model, x))
    else:
        out = check_fits_data(model, data, x, y, task, classes)
        if task.criterion is not None:
            check_loss(loss["_target_"], task, out, y)
    channels_last = channels_last and not isinstance(x, Mapping) and x.dim() == 3  # memory layouts are for images
    train_loader, test_loader = build_loaders(data, train, test, env.rank, env.world_size, env.device,
                                              seed, channels_last, part)
    k = grad_accum
    if len(train_loader) < k:
        raise ConfigError(f"trainer.grad_accum={k} takes {k} batches per optimizer step, but each rank has only "
                          f"{len(train_loader)} per epoch: lower trainer.grad_accum (or data.batch_size)")
    shape = {k: list(v.shape) for k, v in x.items()} if isinstance(x, Mapping) else list(x.shape)
    log.info("data: %d training and %d held-out samples of %s -> %s (%s), %s loader", len(train), len(test),
             shape, list(y.shape) or "a class", task.name, type(train_loader).__name__)
    return Workload(train_loader, test_loader, task, x, y, max(y.numel(), 1), channels_last, classes)


def check_loss(name: str, task: Task, out: torch.Size, y: torch.Tensor) -> None:
    """trainer.loss (its _target_: `name`) must turn a batch of the model's outputs and its targets
    into one number (tried on the meta device: shapes only)."""
    outs = torch.empty(2, *out[1:], device="meta")
    ys = torch.empty(2, *y.shape, dtype=y.dtype, device="meta")
    try:
        loss = task.loss(outs, ys)
    except Exception as e:  # a user's callable: any error it raises is said in one line
        cause = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"trainer.loss._target_={name} fails on the model's outputs {list(outs.shape)} and the "
                          f"targets {list(ys.shape)}: {cause}") from None
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        got = list(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ConfigError(f"trainer.loss._target_={name} returns {got} for a batch, not one number: make it "
                          f"a mean over the batch (reduction='mean')")
