"""Image datasets: Fashion-MNIST (the chapter's) and deterministic random images."""
from __future__ import annotations

from typing import Sequence

import torch

from ddp_lab.config import ConfigError
from ddp_lab.datasets.fashion_mnist_files import RAW_FILES, locate_fashion_mnist, read_idx
from ddp_lab.datasets.pairs import ScaledPixels, TensorPairs


def _scaling(normalize: bool, mean: float, std: float) -> ScaledPixels:
    return ScaledPixels(mean, std) if normalize else ScaledPixels()


def fashion_mnist(root: str | None = None, download: bool = False, cache_dir: str = "~/.cache/ddp_lab",
                  normalize: bool = True, mean: float = 0.2860, std: float = 0.3530
                  ) -> tuple[TensorPairs, TensorPairs]:
    """(train, test): 60,000 and 10,000 28x28 grayscale images of 10 classes, as uint8
    tensors scaled per batch (found as fashion_mnist_files.py says)."""
    raw = locate_fashion_mnist(root, download, cache_dir) / "FashionMNIST" / "raw"
    if download and not all((raw / name).is_file() for name in RAW_FILES):
        # torchvision only to fetch the files: importing it costs every rank ~2 s.
        from torchvision import datasets

        for train in (True, False):
            datasets.FashionMNIST(str(raw.parent.parent), train=train, download=True)
    images_train, labels_train, images_test, labels_test = (read_idx(raw / name) for name in RAW_FILES)
    scaling = _scaling(normalize, mean, std)
    return (TensorPairs(images_train.unsqueeze(1).contiguous(), labels_train.long(), scaling),
            TensorPairs(images_test.unsqueeze(1).contiguous(), labels_test.long(), scaling))


def synthetic_images(image_shape: Sequence[int] = (1, 28, 28), num_classes: int = 10,
                     num_train: int = 60000, num_test: int = 10000, seed: int = 0,
                     normalize: bool = False, mean: float = 0.0, std: float = 1.0
                     ) -> tuple[TensorPairs, TensorPairs]:
    """Deterministic random images and labels: the same on every rank and every run with
    this seed, for throughput runs (nothing to learn)."""
    shape = tuple(image_shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ConfigError(f"data.image_shape={list(shape)} must be [channels, height, width], all >= 1")
    gen = torch.Generator().manual_seed(seed)
    splits = []
    for n in (num_train, num_test):
        images = torch.randint(0, 256, (n, *shape), dtype=torch.uint8, generator=gen)
        labels = torch.randint(0, num_classes, (n,), generator=gen)
        splits.append(TensorPairs(images, labels, _scaling(normalize, mean, std)))
    return splits[0], splits[1]
