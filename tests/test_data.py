"""Building datasets from `data._target_`, sharding them over ranks, and the two loaders agreeing."""

import pytest
import torch
from torch.utils.data import DistributedSampler

from ddp_lab.config import ConfigError
from ddp_lab.data import build_datasets, build_loaders, check_one_batch_fits, eval_indices, per_rank_batch
from ddp_lab.datasets import fashion_mnist


def _loaders(cfg, rank, world, seed=0):
    return build_loaders(cfg, *build_datasets(cfg), rank, world, torch.device("cpu"), seed=seed)


def test_global_batch_is_split_over_ranks():
    assert per_rank_batch(256, 1) == 256
    assert per_rank_batch(256, 2) == 128
    assert per_rank_batch(256, 4) == 64


def test_indivisible_global_batch_is_rejected_with_a_fix():
    with pytest.raises(ConfigError, match=r"batch_size=256 .* 3 ranks; use a multiple of 3 \(e.g. 255 or 258\), "
                                          r"or a world size that divides it \(1, 2, 4, 8, 16, ...\)"):
        per_rank_batch(256, 3)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_training_shards_cover_the_dataset_once_per_epoch(world):
    n = 60  # divisible by every world size above: no padding
    for epoch in (0, 1):
        seen = []
        for rank in range(world):
            s = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=0)
            s.set_epoch(epoch)
            seen += list(s)
        assert sorted(seen) == list(range(n))


def test_set_epoch_reshuffles():
    s = DistributedSampler(range(100), num_replicas=2, rank=0, shuffle=True, seed=0)
    s.set_epoch(0)
    first = list(s)
    s.set_epoch(1)
    assert list(s) != first
    s.set_epoch(0)
    assert list(s) == first


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
def test_eval_shards_hold_every_test_image_exactly_once(world):
    n = 203
    shards = [eval_indices(n, r, world).tolist() for r in range(world)]
    assert sorted(sum(shards, [])) == list(range(n))


def test_gzipped_folder_is_read_through_torchvision(tiny_fmnist, tmp_path, compose_train):
    train, test = fashion_mnist(str(tiny_fmnist), cache_dir=str(tmp_path))
    assert train.inputs.shape == (512, 1, 28, 28) and train.inputs.dtype == torch.uint8
    assert test.inputs.shape == (203, 1, 28, 28)
    # The tiny set marks class k with a bright bar at rows 2k+4 and 2k+5.
    k = int(train.targets[0])
    assert int(train.inputs[0, 0, 2 * k + 4, 10]) == 250


@pytest.mark.parametrize("world", [1, 2])
def test_device_loader_and_dataloader_yield_the_same_batches(tiny_fmnist, tmp_path, compose_train, world):
    base = [f"data.root={tiny_fmnist}", f"data.cache_dir={tmp_path}", "data.batch_size=64"]
    for rank in range(world):
        loaders = {}
        for kind in ("device", "dataloader"):
            cfg = compose_train(base + [f"data.loader={kind}"]).data
            loaders[kind] = _loaders(cfg, rank, world)
        assert type(loaders["device"][0]).__name__ == "DeviceLoader"
        assert type(loaders["dataloader"][0]).__name__ == "TorchLoader"
        for split in (0, 1):
            a = list(loaders["device"][split].epoch(1))
            b = list(loaders["dataloader"][split].epoch(1))
            assert len(a) == len(b) == len(loaders["device"][split])
            for (xa, ya), (xb, yb) in zip(a, b):
                assert torch.equal(ya, yb)
                assert torch.allclose(xa, xb, atol=1e-6)


def test_loader_starts_mid_epoch_at_the_exact_batch(tiny_fmnist, tmp_path, compose_train):
    cfg = compose_train([f"data.root={tiny_fmnist}", f"data.cache_dir={tmp_path}", "data.batch_size=64"]).data
    train, _ = _loaders(cfg, 0, 2)
    full = list(train.epoch(3))
    tail = list(train.epoch(3, start=2))
    assert len(tail) == len(full) - 2
    for (xa, ya), (xb, yb) in zip(full[2:], tail):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_synthetic_data_is_deterministic(compose_train):
    cfg = compose_train(["data=synthetic", "data.num_train=100", "data.num_test=10", "seed=5",
                         "data.batch_size=100", "data.image_shape=[3,8,8]"]).data
    assert cfg.seed == 5  # the images follow the run's seed
    a, _ = _loaders(cfg, 0, 1, seed=5)
    b, _ = _loaders(cfg, 0, 1, seed=5)
    xa, ya = next(iter(a.epoch(0)))
    xb, yb = next(iter(b.epoch(0)))
    assert xa.shape == (100, 3, 8, 8) and torch.equal(xa, xb) and torch.equal(ya, yb)
    assert 0.4 < xa.mean().item() < 0.6  # uniform bytes scaled to [0, 1]


def test_the_training_set_must_hold_one_global_batch(compose_train):
    synthetic = compose_train(["data=synthetic", "data.num_train=100"]).data
    check_one_batch_fits(512, 512, synthetic)  # exactly one: fine
    with pytest.raises(ConfigError) as e:
        check_one_batch_fits(512, 100, synthetic)
    assert str(e.value) == ("data.batch_size=512 is more than the training set's 100 samples (data.num_train=100): "
                            "a global batch is at most 100; lower data.batch_size (or raise data.num_train to 512)")
    with pytest.raises(ConfigError) as e:
        check_one_batch_fits(10**9, 60000, compose_train([]).data)
    assert str(e.value) == ("data.batch_size=1000000000 is more than the training set's 60000 samples: "
                            "a global batch is at most 60000; lower data.batch_size (or use a larger dataset)")
