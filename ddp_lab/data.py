"""Data: shard Fashion-MNIST (found by ddp_lab.fashion_mnist) over the ranks, hand out batches.

`data.batch_size` is the GLOBAL batch, as in d2l: 256 over 2 ranks is 128 per
rank. Two loaders yield the same batches for the same sampler:

* DeviceLoader (default): the whole split as one uint8 tensor on the training
  device; each rank gathers its batch by index. No per-sample PIL work, no
  worker processes, no host-to-device copy per step.
* data.loader=dataloader: torchvision transforms + torch DataLoader, the
  classic path, kept for comparison.

Training shards come from DistributedSampler (seeded, set_epoch every epoch).
Evaluation uses `eval_indices`, which never pads: every test image counts once.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
from torch.utils.data import DataLoader, DistributedSampler, Subset
from torchvision import datasets, transforms

from ddp_lab.config import ConfigError
from ddp_lab.fashion_mnist import locate_fashion_mnist


# ---------------------------------------------------------------- the splits
@dataclass
class Split:
    images: torch.Tensor  # uint8, (N, C, H, W)
    labels: torch.Tensor  # int64, (N,)

    def __len__(self) -> int:
        return len(self.labels)


def fashion_mnist_splits(cfg) -> tuple[Split, Split]:
    root = locate_fashion_mnist(cfg.root, cfg.download, cfg.cache_dir)
    out = []
    for train in (True, False):
        # FashionMNIST parses the IDX files; .data/.targets are its tensors.
        ds = datasets.FashionMNIST(str(root), train=train, download=cfg.download)
        out.append(Split(ds.data.unsqueeze(1).contiguous(), ds.targets.long()))
    return out[0], out[1]


def synthetic_splits(cfg, seed: int) -> tuple[Split, Split]:
    """Deterministic random images: the same on every rank and every run with this seed."""
    shape = tuple(cfg.image_shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ConfigError(f"data.image_shape={list(shape)} must be [channels, height, width], all >= 1")
    gen = torch.Generator().manual_seed(seed)
    splits = []
    for n in (cfg.num_train, cfg.num_test):
        images = torch.randint(0, 256, (n, *shape), dtype=torch.uint8, generator=gen)
        labels = torch.randint(0, cfg.num_classes, (n,), generator=gen)
        splits.append(Split(images, labels))
    return splits[0], splits[1]


FASHION_MNIST_SHAPE, FASHION_MNIST_CLASSES = (1, 28, 28), 10


def image_shape(cfg) -> tuple[int, ...]:
    """(channels, height, width) of the images `cfg` (the data group) describes."""
    return tuple(cfg.image_shape) if cfg.name == "synthetic" else FASHION_MNIST_SHAPE


def num_classes(cfg) -> int:
    """How many classes the labels of `cfg` (the data group) take."""
    return cfg.num_classes if cfg.name == "synthetic" else FASHION_MNIST_CLASSES


def check_one_batch_fits(global_batch: int, n_train: int, name: str) -> None:
    """The training set must hold a whole global batch: else every step is one partial
    batch (or none), while summary.json reports the global batch asked for."""
    if global_batch <= n_train:
        return
    synthetic = f" (data.num_train={n_train})" if name == "synthetic" else ""
    more = f" (or raise data.num_train to {global_batch})" if name == "synthetic" else ""
    raise ConfigError(f"data.batch_size={global_batch} is more than the training set's {n_train} "
                      f"images{synthetic}: a global batch is at most {n_train}; lower data.batch_size{more}")


def per_rank_batch(global_batch: int, world_size: int) -> int:
    if global_batch % world_size:
        lo = global_batch // world_size * world_size or world_size
        sizes = [n for n in range(1, 17) if global_batch % n == 0]
        raise ConfigError(
            f"data.batch_size={global_batch} is the GLOBAL batch and must divide evenly over "
            f"{world_size} ranks; use a multiple of {world_size} (e.g. {lo} or {lo + world_size}), "
            f"or a world size that divides it ({', '.join(map(str, sizes))}, ...)"
        )
    return global_batch // world_size


def eval_indices(n: int, rank: int, world_size: int) -> torch.Tensor:
    """This rank's share of the test set, without DistributedSampler's padding.

    Strided, so the shards are disjoint and together hold every index once;
    their sizes differ by at most one, which evaluation (no collective per
    batch) does not mind.
    """
    return torch.arange(rank, n, world_size)


# ---------------------------------------------------------------- loaders
class DeviceLoader:
    """Batches gathered by index from a split held on the training device."""

    def __init__(self, split: Split, batch_size: int, device: torch.device,
                 sampler: DistributedSampler | None = None, indices: torch.Tensor | None = None,
                 mean: float = 0.0, std: float = 1.0, channels_last: bool = False):
        self.images = split.images.to(device)
        self.labels = split.labels.to(device)
        self.batch_size = batch_size
        self.sampler = sampler
        self.indices = indices if indices is not None else torch.arange(len(split))
        self.mean, self.std = mean, std
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format

    def __len__(self) -> int:
        n = len(self.sampler) if self.sampler is not None else len(self.indices)
        return -(-n // self.batch_size)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The batches of `epoch`, beginning at batch `start` (for mid-epoch resume)."""
        if self.sampler is not None:
            self.sampler.set_epoch(epoch)
            order = torch.tensor(list(self.sampler), dtype=torch.long)
        else:
            order = self.indices
        order = order.to(self.images.device)
        for i in range(start * self.batch_size, len(order), self.batch_size):
            idx = order[i:i + self.batch_size]
            x = self.images.index_select(0, idx).float().div_(255)
            x = x.sub_(self.mean).div_(self.std).contiguous(memory_format=self.memory_format)
            yield x, self.labels.index_select(0, idx)


class TorchLoader:
    """The classic path: torchvision transforms in a torch DataLoader."""

    def __init__(self, dataset, batch_size: int, device: torch.device, num_workers: int,
                 sampler: DistributedSampler | None = None, channels_last: bool = False):
        self.sampler = sampler
        self.batch_size = batch_size
        self.device = device
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, shuffle=False,
                                 num_workers=num_workers, pin_memory=device.type == "cuda",
                                 persistent_workers=num_workers > 0)

    def __len__(self) -> int:
        return len(self.loader)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.sampler is not None:
            self.sampler.set_epoch(epoch)
        for x, y in itertools.islice(self.loader, start, None):
            x = x.to(self.device, non_blocking=True).contiguous(memory_format=self.memory_format)
            yield x, y.to(self.device, non_blocking=True)


class _TensorImages(torch.utils.data.Dataset):
    """Split as a Dataset of (image, label) with the same scaling as DeviceLoader."""

    def __init__(self, split: Split, mean: float, std: float):
        self.split = split
        self.transform = transforms.Compose([transforms.ConvertImageDtype(torch.float32),
                                             transforms.Normalize((mean,), (std,))])

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, i):
        return self.transform(self.split.images[i]), self.split.labels[i]


def _fashion_mnist_dataset(root: Path, train: bool, mean: float, std: float):
    tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize((mean,), (std,))])
    return datasets.FashionMNIST(str(root), train=train, transform=tf)


def build_loaders(cfg, rank: int, world_size: int, device: torch.device, seed: int,
                  channels_last: bool = False):
    """(train loader, test loader) for this rank, as `cfg` (the data group) describes."""
    batch = per_rank_batch(cfg.batch_size, world_size)
    mean, std = (cfg.mean, cfg.std) if cfg.normalize else (0.0, 1.0)
    if cfg.name == "fashion_mnist" and cfg.loader == "dataloader":
        # The classic path: PIL images through torchvision transforms, per sample.
        root = locate_fashion_mnist(cfg.root, cfg.download, cfg.cache_dir)
        train_ds = _fashion_mnist_dataset(root, True, mean, std)
        test_ds = _fashion_mnist_dataset(root, False, mean, std)
    elif cfg.name == "fashion_mnist":
        train, test = fashion_mnist_splits(cfg)
    else:
        train, test = synthetic_splits(cfg, seed)
        if cfg.loader == "dataloader":
            train_ds, test_ds = _TensorImages(train, mean, std), _TensorImages(test, mean, std)
    n_train, n_test = (len(train_ds), len(test_ds)) if cfg.loader == "dataloader" else (len(train), len(test))
    check_one_batch_fits(cfg.batch_size, n_train, cfg.name)
    sampler = DistributedSampler(range(n_train), num_replicas=world_size, rank=rank,
                                 shuffle=True, seed=seed, drop_last=False)
    test_idx = eval_indices(n_test, rank, world_size)
    if cfg.loader == "device":
        kw = dict(device=device, mean=mean, std=std, channels_last=channels_last)
        return (DeviceLoader(train, batch, sampler=sampler, **kw),
                DeviceLoader(test, batch, indices=test_idx, **kw))
    kw = dict(device=device, num_workers=cfg.num_workers, channels_last=channels_last)
    return (TorchLoader(train_ds, batch, sampler=sampler, **kw),
            TorchLoader(Subset(test_ds, test_idx.tolist()), batch, **kw))
