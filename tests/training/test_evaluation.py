"""Evaluation is exact: the same weights score the same at every world size."""
from pathlib import Path

import torch
from hydra import compose, initialize_config_module

from ddp_lab.distributed import DistEnv
from ddp_lab.training.trainer import Trainer
from tests.multiproc import run_in_processes


def _trainer(data_root, tmp, rank, world_size, backend) -> Trainer:
    from ddp_lab.config import schema
    schema.register()
    with initialize_config_module(version_base="1.3", config_module="ddp_lab.conf"):
        cfg = compose("train", [f"data.root={data_root}", f"data.cache_dir={tmp}/cache",
                                "data.batch_size=60", "trainer.amp=off"])
    env = DistEnv(rank, world_size, 0, torch.device("cpu"), backend)
    return Trainer.from_config(cfg, env, Path(tmp) / f"w{world_size}")


def _evaluate(rank, world_size, data_root, tmp, state):
    trainer = _trainer(data_root, tmp, rank, world_size, "gloo")
    trainer.model.load_state_dict(state)
    try:
        return trainer.evaluate()
    finally:
        trainer.close()


def test_accuracy_is_identical_at_world_sizes_1_2_3(tiny_fmnist, tmp_path):
    single = _trainer(tiny_fmnist, tmp_path, 0, 1, "none")
    # A few steps of training: weights that get some, not all, test images right.
    batches = single.train_loader.epoch(0)
    for _ in range(3):
        single._run_batch([next(batches)])
    state = {k: v.clone() for k, v in single.model.state_dict().items()}
    reference = single.evaluate()
    single.close()
    loss_sum, correct, total = reference
    assert total == 203  # every test image, counted once
    assert 0 < correct < 203  # a real count, computed from the weights
    assert 0 < loss_sum / total < 10
    for w in (2, 3):
        results = run_in_processes(_evaluate, w, str(tiny_fmnist), str(tmp_path), state)
        # the counts exactly; the loss sum to float32's precision (each batch's mean loss is a
        # float32 over other samples at another world size)
        assert all(tuple(r)[1:] == reference[1:] for r in results), (w, results, reference)
        assert all(abs(r[0] - loss_sum) < 1e-6 * loss_sum for r in results), (w, results, reference)


def _regression(rank, world_size, tmp, state):
    from ddp_lab.config import schema
    schema.register()
    with initialize_config_module(version_base="1.3", config_module="ddp_lab.conf"):
        cfg = compose("train", ["model=custom", "model._target_=tests.workloads.regressor", "data=custom",
                                "data._target_=tests.workloads.linear_regression", "data.batch_size=60",
                                "+data.num_test=203", "trainer.amp=off"])
    backend = "gloo" if world_size > 1 else "none"
    env = DistEnv(rank, world_size, 0, torch.device("cpu"), backend)
    trainer = Trainer.from_config(cfg, env, Path(tmp) / f"r{world_size}")
    trainer.model.load_state_dict(state)
    try:
        return trainer.evaluate()
    finally:
        trainer.close()


def test_a_regressions_held_out_loss_is_the_same_mean_at_two_ranks(tmp_path):
    state = {"weight": torch.linspace(-1, 1, 8).view(1, 8), "bias": torch.tensor([0.5])}
    one = _regression(0, 1, str(tmp_path), state)
    assert one[1:] == (0, 203)  # samples, none "correct"
    two = run_in_processes(_regression, 2, str(tmp_path), state)
    assert all(tuple(r)[1:] == one[1:] and abs(r[0] - one[0]) < 1e-6 * one[0] for r in two), (one, two)
