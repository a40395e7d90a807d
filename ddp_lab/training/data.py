"""Data: build the datasets `data._target_` names, check them, shard them over the ranks.

`data.batch_size` is the GLOBAL batch, as in d2l: 256 over 2 ranks is 128 per
rank. Two loaders yield the same batches for the same sampler:

* DeviceLoader: a split held as tensors (ddp_lab.datasets.TensorPairs) on the
  training device; each rank gathers its batch by index. No per-sample Python,
  no worker processes, no host-to-device copy per step.
* TorchLoader: torch's DataLoader over any Dataset (data.loader=dataloader, or
  auto where the data is not tensors or does not fit).

A batch is (input, target), or, for dict samples (Hugging Face style, with `labels`),
(the dict, its labels): the model takes the dict by keyword (ddp_lab.models.calling).

Training shards come from DistributedSampler (seeded, set_epoch every epoch).
Evaluation uses `eval_indices`, which never pads: every test sample counts once.
"""
from __future__ import annotations

import itertools
import multiprocessing
import os
from functools import partial
from typing import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, SequentialSampler, Subset

from ddp_lab.config import ConfigError, targets
from ddp_lab.datasets import TensorPairs, as_tensor_pairs
from ddp_lab.datasets.keyed import KeyedPairs, TensorDicts, collate, keys_of
from ddp_lab.datasets.object_bytes import object_bytes
from ddp_lab.datasets.text import CONTEXT, TokenWindows
from ddp_lab.models.calling import LABELS, to_device

# loader=auto keeps a split on the device while both splits take at most this share of its memory
DEVICE_SHARE = 0.25


# ---------------------------------------------------------------- the datasets
def build_datasets(cfg) -> tuple[Dataset, Dataset]:
    """(train, test) from `cfg._target_` (the data group), checked before any step."""
    out = targets.build("data", cfg)
    name = cfg["_target_"]
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise ConfigError(f"data._target_={name} returned {type(out).__name__}, not (train, test): "
                          f"return two Datasets of (input, target) pairs")
    out = [by_keys(ds, split, cfg, name) for split, ds in zip(("train", "test"), out)]
    for split, ds in zip(("train", "test"), out):
        check_dataset(ds, split, name)
    return out[0], out[1]


def by_keys(ds, split: str, cfg, name: str):
    """A dataset of dicts (what Hugging Face datasets return) as (input, target) pairs,
    taken by data.input_key and data.target_key; anything else as it is."""
    inp, tgt = cfg.get("input_key", ""), cfg.get("target_key", "")
    if not (inp or tgt):
        check_map_style(ds, split, name)
        return TensorDicts(ds) if keys_of(ds[0]) is not None else ds
    if not (inp and tgt):
        unset = "data.target_key" if inp else "data.input_key"
        raise ConfigError(f"{unset} is not set: a sample's input and target are taken by data.input_key and "
                          f"data.target_key together; set both, or neither for (input, target) samples")
    check_map_style(ds, split, name)
    keys = keys_of(ds[0])
    if keys is None:
        raise ConfigError(f"data.input_key={inp} is set, but data._target_={name}'s {split} samples are "
                          f"{type(ds[0]).__name__}, not dicts: unset data.input_key and data.target_key")
    for key, value in (("input_key", inp), ("target_key", tgt)):
        if value not in keys:
            raise ConfigError(f"data.{key}={value} is not a key of data._target_={name}'s {split} samples "
                              f"(their keys: {', '.join(keys)}): set data.{key} to one of them")
    return KeyedPairs(ds, inp, tgt)


def check_map_style(ds, split: str, name: str) -> None:
    """A Dataset with a length, not empty."""
    if not (hasattr(ds, "__getitem__") and hasattr(ds, "__len__")):
        raise ConfigError(f"data._target_={name}: its {split} split is a {type(ds).__name__}, not a "
                          f"Dataset with a length (a map-style torch Dataset)")
    if len(ds) == 0:
        raise ConfigError(f"data._target_={name}: its {split} split is empty")


def check_dataset(ds, split: str, name: str) -> None:
    """A Dataset with a length, not empty, whose samples are (input tensor, target) pairs."""
    check_map_style(ds, split, name)
    sample = ds[0]
    if (keys := keys_of(sample)) is not None:
        return check_dict_sample(sample, keys, split, name)
    if not (isinstance(sample, (tuple, list)) and len(sample) == 2):
        got = f"a {len(sample)}-tuple" if isinstance(sample, (tuple, list)) else type(sample).__name__
        raise ConfigError(f"data._target_={name}: its {split} split yields {got}, not (input, target): "
                          f"make __getitem__ return (input, target)")
    x, y = sample
    if not isinstance(x, torch.Tensor):
        raise ConfigError(f"data._target_={name}: its {split} inputs are {type(x).__name__}, not tensors")
    try:
        torch.as_tensor(y)
    except (TypeError, ValueError, RuntimeError):
        raise ConfigError(f"data._target_={name}: its {split} targets are {type(y).__name__}, not numbers or "
                          f"tensors") from None


def check_dict_sample(sample: dict, keys: list[str], split: str, name: str) -> None:
    """A dict sample the model takes whole: tensors (or numbers, lists), labels among them."""
    if LABELS not in keys:
        raise ConfigError(f"data._target_={name}: its {split} samples are dicts without '{LABELS}' (keys: "
                          f"{', '.join(keys)}): add the targets as '{LABELS}' (the model's own loss takes them), "
                          f"or set data.input_key and data.target_key to use (input, target) pairs")
    odd = [k for k, v in sample.items() if not isinstance(v, torch.Tensor)]
    if odd:
        raise ConfigError(f"data._target_={name}: its {split} samples' {', '.join(odd)} are not tensors, numbers "
                          f"or lists of numbers: drop those keys (a dataset's text column, say) before training")


def example(ds) -> tuple:
    """One (input, target) sample, targets as a tensor; for dict samples, (the dict, its labels)."""
    sample = ds[0]
    if keys_of(sample) is not None:
        return sample, torch.as_tensor(sample[LABELS])
    x, y = sample
    return x, torch.as_tensor(y)


def check_one_batch_fits(global_batch: int, n_train: int, cfg=None, tokens: int | None = None) -> None:
    """The training set must hold a whole global batch: else every step is one partial
    batch (or none), while summary.json reports the global batch asked for. `tokens`: the
    length of the token sequence the samples are windows of (data=text), where the
    context, not the batch, may be what is too large."""
    if global_batch <= n_train:
        return
    if tokens is not None and cfg is not None and "block_size" in cfg:
        most = (tokens - 1) // global_batch  # the longest context that yields global_batch windows
        lower = f"lower {CONTEXT} to at most {most}, or " if most > 0 else ""
        raise ConfigError(f"data.batch_size={global_batch} samples of data.block_size={cfg.block_size} tokens "
                          f"need {global_batch * cfg.block_size + 1:,} tokens, but the training split holds "
                          f"{tokens:,} ({n_train} samples): {lower}lower data.batch_size to at most {n_train}")
    sized = cfg is not None and "num_train" in cfg  # a dataset whose size is a key
    which = f" (data.num_train={n_train})" if sized else ""
    more = f" (or raise data.num_train to {global_batch})" if sized else " (or use a larger dataset)"
    raise ConfigError(f"data.batch_size={global_batch} is more than the training set's {n_train} "
                      f"samples{which}: a global batch is at most {n_train}; lower data.batch_size{more}")


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
    return torch.arange(rank, max(n, rank), world_size)  # a rank past the last sample: none


# ---------------------------------------------------------------- loaders
def _layout(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    # channels_last is a layout of image batches (N, C, H, W) only
    return x.contiguous(memory_format=torch.channels_last) if channels_last and x.dim() == 4 else x


class DeviceLoader:
    """Batches gathered by index from a split held on the training device."""

    def __init__(self, split: TensorPairs, batch_size: int, device: torch.device,
                 sampler: DistributedSampler | None = None, indices: torch.Tensor | None = None,
                 channels_last: bool = False):
        self.split = split.to(device)
        self.batch_size = batch_size
        self.sampler = sampler
        self.indices = indices if indices is not None else torch.arange(len(split))
        self.channels_last = channels_last

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
        order = order.to(self.split.targets.device)
        for i in range(start * self.batch_size, len(order), self.batch_size):
            x, y = self.split.batch(order[i:i + self.batch_size])
            yield _layout(x, self.channels_last), y


class StartAt(Sampler):
    """`sampler`'s indices from position `start` on: a resumed epoch skips the batches it trained on by
    index, never loading them (a DataLoader would read and collate each one to throw it away)."""

    def __init__(self, sampler):
        self.sampler, self.start = sampler, 0

    def __iter__(self):
        return itertools.islice(iter(self.sampler), self.start, None)

    def __len__(self) -> int:
        return max(len(self.sampler) - self.start, 0)


class TorchLoader:
    """Any Dataset through torch's DataLoader."""

    def __init__(self, dataset, batch_size: int, device: torch.device, num_workers: int,
                 sampler: DistributedSampler | None = None, channels_last: bool = False):
        self.sampler = sampler
        self.order = StartAt(sampler if sampler is not None else SequentialSampler(dataset))
        self.batch_size = batch_size
        self.device = device
        self.channels_last = channels_last
        # each worker writes its pid here as it starts (its memory is measured: telemetry/worker_memory.py)
        self.pids = multiprocessing.Array("i", num_workers, lock=False) if num_workers else []
        self.loader = DataLoader(dataset, batch_size=batch_size, sampler=self.order, shuffle=False,
                                 collate_fn=collate, num_workers=num_workers, pin_memory=device.type == "cuda",
                                 persistent_workers=num_workers > 0,
                                 worker_init_fn=partial(_note_pid, self.pids) if num_workers else None)

    @property
    def worker_pids(self) -> list[int]:
        """The worker processes started so far (none before the first batch, or without workers)."""
        return [p for p in self.pids if p]

    def __len__(self) -> int:
        return -(-len(self.order.sampler) // self.batch_size)  # (the whole epoch's, wherever it starts)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.sampler is not None:
            self.sampler.set_epoch(epoch)
        self.order.start = start * self.batch_size
        for batch in self.loader:
            if isinstance(batch, dict):  # the model takes it by keyword; its labels are the targets
                x = to_device(batch, self.device, non_blocking=True)
                yield x, x[LABELS]
                continue
            x, y = batch
            x = _layout(x.to(self.device, non_blocking=True), self.channels_last)
            yield x, torch.as_tensor(y).to(self.device, non_blocking=True)


def _note_pid(pids, worker_id: int) -> None:
    pids[worker_id] = os.getpid()


def _fits_device(nbytes: int, device: torch.device) -> bool:
    if device.type == "cuda":
        return nbytes <= DEVICE_SHARE * torch.cuda.get_device_properties(device).total_memory
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return True
    return nbytes <= DEVICE_SHARE * memory


def choose_loader(cfg, train, test, device: torch.device) -> str:
    """device or dataloader, as data.loader asks (auto: device where both splits are
    tensors that take at most DEVICE_SHARE of the device's memory)."""
    pairs = [as_tensor_pairs(ds) for ds in (train, test)]
    tensors = all(p is not None for p in pairs)
    if cfg.loader == "device" and not tensors:
        raise ConfigError(f"data.loader=device needs both splits as tensors (ddp_lab.datasets.TensorPairs "
                          f"or a TensorDataset of two); data._target_={cfg['_target_']} returned "
                          f"{type(train).__name__}: use data.loader=auto or dataloader")
    if cfg.loader != "auto":
        return str(cfg.loader)
    return "device" if tensors and _fits_device(sum(p.nbytes for p in pairs), device) else "dataloader"


def loader_workers(cfg, train, test, device: torch.device) -> int:
    """The DataLoader worker processes a rank runs: data.num_workers for each of its two loaders (training and
    evaluation, both persistent) where the data goes through torch's DataLoader, else none."""
    return 2 * cfg.num_workers if choose_loader(cfg, train, test, device) == "dataloader" else 0


def worker_copies(num_workers: int, datasets) -> int:
    """The bytes `num_workers` workers of each of `datasets`' loaders may copy of their Python objects, together:
    a worker's reads write the reference counts of the objects it loads (datasets/object_bytes.py)."""
    return num_workers * sum(object_bytes(d) for d in datasets) if num_workers else 0


def loader_copies(cfg, train, test, device: torch.device) -> int:
    """worker_copies of the two loaders a rank runs, as loader_workers counts them (the whole held-out split, where
    a run counts its rank's part and the list of its indices)."""
    return worker_copies(cfg.num_workers, (train, test)) if loader_workers(cfg, train, test, device) else 0


def build_loaders(cfg, train, test, rank: int, world_size: int, device: torch.device, seed: int,
                  channels_last: bool = False, part: tuple[int, int] | None = None):
    """(train loader, test loader) for this rank over the datasets `cfg` (the data group) built. The training
    set is cut into `part`'s parts (part, parts), else world_size (islands under torchft: each island its own
    part of data.batch_size, the held-out set still this job's ranks')."""
    train_rank, parts = part or (rank, world_size)
    batch = per_rank_batch(cfg.batch_size, parts)
    check_one_batch_fits(cfg.batch_size, len(train), cfg, train.tokens if isinstance(train, TokenWindows) else None)
    sampler = DistributedSampler(range(len(train)), num_replicas=parts, rank=train_rank,
                                 shuffle=True, seed=seed, drop_last=False)
    test_idx = eval_indices(len(test), rank, world_size)
    if choose_loader(cfg, train, test, device) == "device":
        kw = dict(device=device, channels_last=channels_last)
        return (DeviceLoader(as_tensor_pairs(train), batch, sampler=sampler, **kw),
                DeviceLoader(as_tensor_pairs(test), batch, indices=test_idx, **kw))
    kw = dict(device=device, num_workers=cfg.num_workers, channels_last=channels_last)
    return (TorchLoader(train, batch, sampler=sampler, **kw),
            TorchLoader(Subset(test, test_idx.tolist()), batch, **kw))
