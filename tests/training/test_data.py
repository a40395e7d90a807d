"""Building datasets from `data._target_`, sharding them over ranks, and the two loaders agreeing."""

import pytest
import torch
from torch.utils.data import DistributedSampler

from ddp_lab.config import ConfigError
from ddp_lab.datasets import fashion_mnist
from ddp_lab.training.data import (
    TorchLoader,
    build_datasets,
    build_loaders,
    check_one_batch_fits,
    eval_indices,
    loader_workers,
    per_rank_batch,
)


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


@pytest.mark.parametrize("n,world", [(203, 1), (203, 2), (203, 3), (203, 4), (203, 7), (1, 4), (2, 4), (0, 2)])
def test_eval_shards_hold_every_test_image_exactly_once(n, world):
    """Fewer held-out samples than ranks too (a small validation split): the ranks past them get none."""
    shards = [eval_indices(n, r, world).tolist() for r in range(world)]
    assert sorted(sum(shards, [])) == list(range(n))
    assert [len(s) for s in shards] == [len(range(r, n, world)) for r in range(world)]


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


def test_the_worker_processes_a_rank_runs_are_counted_as_its_loaders_hold_them(tiny_fmnist, tmp_path,
                                                                                  compose_train):
    """data.num_workers for each of the two loaders (both persistent) through the DataLoader, none on the device
    loader: the count the fit check prices (training/memory_estimate.py's workers)."""
    from ddp_lab.training.workload import Workload
    base = [f"data.root={tiny_fmnist}", f"data.cache_dir={tmp_path}", "data.num_workers=2"]
    for kind, workers in (("dataloader", 4), ("device", 0)):
        cfg = compose_train(base + [f"data.loader={kind}"]).data
        train, test = build_datasets(cfg)
        loaders = build_loaders(cfg, train, test, 0, 2, torch.device("cpu"), seed=0)
        assert Workload(*loaders, None, None, None, 1, False).loader_workers == workers
        assert loader_workers(cfg, train, test, torch.device("cpu")) == workers


def test_loader_starts_mid_epoch_at_the_exact_batch(tiny_fmnist, tmp_path, compose_train):
    cfg = compose_train([f"data.root={tiny_fmnist}", f"data.cache_dir={tmp_path}", "data.batch_size=64"]).data
    train, _ = _loaders(cfg, 0, 2)
    full = list(train.epoch(3))
    tail = list(train.epoch(3, start=2))
    assert len(tail) == len(full) - 2
    for (xa, ya), (xb, yb) in zip(full[2:], tail):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


class CountedReads(torch.utils.data.Dataset):
    def __init__(self, n: int):
        self.n, self.reads = n, 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        self.reads += 1
        return torch.tensor([float(i)]), i % 3


def test_a_mid_epoch_start_through_the_dataloader_reads_no_skipped_sample():
    """Skipped by index in the sampler: a resume at 90% of an epoch reads the last 10%, not all of it."""
    data = CountedReads(1000)
    sampler = DistributedSampler(range(1000), num_replicas=2, rank=1, shuffle=True, seed=0)
    loader = TorchLoader(data, 10, torch.device("cpu"), 0, sampler=sampler)
    full = [y.tolist() for _, y in loader.epoch(4)]
    data.reads = 0
    tail = [y.tolist() for _, y in loader.epoch(4, start=45)]
    assert tail == full[45:] and len(full) == len(loader) == 50
    assert data.reads == 50  # the 5 batches left, 10 samples each
    assert len(list(loader.epoch(5))) == 50  # the next epoch from its start


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


def test_a_context_that_leaves_too_few_samples_is_blamed_not_the_batch(compose_train, tmp_path):
    """model=gpt model.block_size=100000 on the fortunes used to say the batch was too large for
    23 samples; the context is what made them 23."""
    (tmp_path / "c.txt").write_bytes(bytes(10_000))  # 9,000 training tokens, 1,000 held out
    cfg = compose_train(["model=gpt", "data=text", f"data.path={tmp_path}/c.txt", "model.block_size=999"]).data
    assert cfg.block_size == 999  # the text follows the model's context
    train, test = build_datasets(cfg)
    assert (len(train), train.tokens, len(test)) == (9, 9000, 1)
    with pytest.raises(ConfigError) as e:
        build_loaders(cfg, train, test, 0, 1, torch.device("cpu"), seed=0)
    assert str(e.value) == ("data.batch_size=64 samples of data.block_size=999 tokens need 63,937 tokens, but the "
                            "training split holds 9,000 (9 samples): lower the context (model.block_size, which "
                            "data.block_size follows) to at most 140, or lower data.batch_size to at most 9")
    shorter = compose_train(["model=gpt", "data=text", f"data.path={tmp_path}/c.txt", "model.block_size=140"]).data
    train, test = build_datasets(shorter)
    assert len(train) == 64 and len(build_loaders(shorter, train, test, 0, 1, torch.device("cpu"), seed=0)[0]) == 1


def test_samples_that_are_dicts_are_taken_by_their_keys(compose_train):
    base = ["data=custom", "data._target_=tests.workloads.dict_blobs", "data.batch_size=64"]
    whole, _ = build_datasets(compose_train(base).data)  # no keys: the dict goes to the model, label as labels
    assert sorted(whole[3]) == ["features", "id", "labels"]
    assert int(whole[3]["labels"]) == int(whole.dataset[3]["label"])
    cfg = compose_train(base + ["data.input_key=features", "data.target_key=label"]).data
    train, test = build_datasets(cfg)
    x, y = train[3]
    assert x.dtype == torch.float32 and x.shape == (8,) and y.dtype == torch.int64 and y.ndim == 0
    assert x.tolist() == pytest.approx(train.dataset.pairs[3][0].tolist()) and int(y) == int(train.dataset.pairs[3][1])
    loader, _ = build_loaders(cfg, train, test, 0, 2, torch.device("cpu"), seed=0)
    xb, yb = next(iter(loader.epoch(0)))
    assert (type(loader).__name__, xb.shape, yb.shape) == ("TorchLoader", (32, 8), (32,))


@pytest.mark.parametrize("keys,message", [
    (["data.input_key=image", "data.target_key=label"],
     "data.input_key=image is not a key of data._target_=tests.workloads.dict_blobs's train samples (their keys: "
     "features, label, id): set data.input_key to one of them"),
    (["data.input_key=features"], "data.target_key is not set: a sample's input and target are taken by "
                                  "data.input_key and data.target_key together; set both"),
    (["data._target_=tests.workloads.blobs", "data.input_key=x", "data.target_key=y"],
     "data.input_key=x is set, but data._target_=tests.workloads.blobs's train samples are tuple, not dicts: unset "
     "data.input_key and data.target_key"),
])
def test_dict_keys_that_do_not_fit_the_samples_are_refused(compose_train, keys, message):
    cfg = compose_train(["data=custom", "data._target_=tests.workloads.dict_blobs", *keys]).data
    with pytest.raises(ConfigError) as e:
        build_datasets(cfg)
    assert message in str(e.value)
