"""A user's own model and data: named by `_target_`, checked before any step, trained
data-parallel under torchrun (a test's vectors, the examples/spirals project, the GPT)."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ddp_lab.config import ConfigError, schema
from ddp_lab.distributed import DistEnv
from ddp_lab.training.trainer import Trainer
from tests.conftest import failure, read_summary, run_module

ROOT = Path(__file__).parents[1]
EXAMPLE = ROOT / "examples" / "spirals"
QUICK = ["trainer.progress=false", "trainer.compile=false", "trainer.warmup_steps=1", "trainer.log_every=5"]
VECTORS = ["model=custom", "model._target_=tests.workloads.linear", "data=custom",
           "data._target_=tests.workloads.blobs", "data.batch_size=64"]


def _build(compose_train, tmp_path, overrides):
    """What the entry point does before training: the schema's ranges, then the Trainer."""
    cfg = compose_train(list(overrides) + QUICK)
    schema.check(cfg)
    Trainer.from_config(cfg, DistEnv(0, 1, 0, torch.device("cpu"), "none"), tmp_path).close()


MODEL = VECTORS[:2]
DATA = VECTORS[2:]
REGRESSION = ["model=custom", "model._target_=tests.workloads.regressor", "data=custom",
              "data._target_=tests.workloads.linear_regression", "+data.num_train=2048", "data.batch_size=64",
              "optim.lr=0.05"]


@pytest.mark.parametrize("overrides,message", [
    (["model=custom", *DATA], "model._target_ is not set: name the callable that builds it"),
    (["model=custom", "model._target_=no_such_package.net", *DATA],
     "model._target_=no_such_package.net does not import (No module named 'no_such_package'): check the "
     "dotted path"),
    (["model=custom", "model._target_=math.pi", *DATA], "model._target_=math.pi is a float, not a callable"),
    (["model=custom", "model._target_=tests.workloads.not_a_module", *DATA],
     "model._target_=tests.workloads.not_a_module returned str, not an nn.Module"),
    (["model._target_=tests.workloads.linear", *DATA],  # the preset's keys stay: lenet's are not linear's
     "model.num_classes is not an argument of tests.workloads.linear: drop it (or, for a model other than "
     "the preset's, start from model=custom)"),
    (["+model.depth=3", *DATA], "model.depth is not an argument of ddp_lab.models.lenet_fast.lenet_fast"),
    ([*MODEL, "+model.classes=2", *DATA], "the data's targets go up to 3 but model=linear predicts 2 classes"),
    (["model=gpt", *DATA], "model=gpt cannot take the data's inputs (one is [8], float32)"),
    (["model=gpt", "data=synthetic", "data.num_train=64", "data.num_test=8", "data.batch_size=8"],
     "data.image_shape=[1, 28, 28] does not fit model=gpt (Expected tensor for argument #1 'indices' to have "
     "one of the following scalar types: Long, Int; but got torch.float32 instead)"),
    (["model=lenet", *DATA], "model=lenet cannot take the data's inputs (one is [8], float32)"),
    (["model=custom", "model._target_=tests.workloads.per_feature", *DATA],
     "model=per_feature outputs [1, 8, 4] for one input, but a classification target is one class id: the "
     "model must output [1, 'classes']"),
    ([*MODEL, "data=custom", "data._target_=tests.workloads.broken", "+data.kind=triples"],
     "its train split yields a 3-tuple, not (input, target): make __getitem__ return (input, target)"),
    ([*MODEL, "data=custom", "data._target_=tests.workloads.broken", "+data.kind=empty"],
     "its train split is empty"),
    ([*MODEL, "data=custom", "data._target_=tests.workloads.broken", "+data.kind=one_split"],
     "data._target_=tests.workloads.broken returned TensorDataset, not (train, test)"),
    ([*MODEL, "data=custom", "data._target_=tests.workloads.broken", "+data.kind=float_targets"],
     "model=linear outputs [1, 4] for one input, but a regression target is one number: the model must output "
     "[1] (or [1, 1])"),
    ([*MODEL, "data=custom", "data._target_=tests.workloads.broken", "+data.kind=a_list"],
     "its train split yields int, not (input, target)"),
    ([*VECTORS, "data.batch_size=2048"], "data.batch_size=2048 is more than the training set's 1024 samples: a "
                                         "global batch is at most 1024; lower data.batch_size (or use a larger "
                                         "dataset)"),
    ([*MODEL, "+model.dim=2", "+model.classes=3", "data=custom", "data.loader=device",
      "data._target_=examples.spirals.spirals.data.spirals"],
     "data.loader=device needs both splits as tensors (ddp_lab.datasets.TensorPairs or a TensorDataset of two); "
     "data._target_=examples.spirals.spirals.data.spirals returned Spirals: use data.loader=auto or dataloader"),
    ([*VECTORS, "+data.colour=red"], "data.colour is not an argument of tests.workloads.blobs"),
    ([*VECTORS, "data.batch_size=lots"], "data.batch_size='lots': Value 'lots' of type 'str' could not be "
                                         "converted to Integer"),
    ([*REGRESSION, "trainer.loss._target_=torch.nn.MSELoss", "+trainer.loss.reduction=none"],
     "trainer.loss._target_=torch.nn.MSELoss returns [2] for a batch, not one number: make it a mean over the "
     "batch (reduction='mean')"),
    ([*REGRESSION, "trainer.loss._target_=torch.nn.MSELoss", "+trainer.loss.delta=1"],
     "trainer.loss.delta is not an argument of torch.nn.MSELoss: drop it"),
    ([*REGRESSION, "trainer.loss._target_=torch.nn.functional.cosine_embedding_loss"],
     "trainer.loss._target_=torch.nn.functional.cosine_embedding_loss fails on the model's outputs [2, 1] and the "
     "targets [2]: cosine_embedding_loss() missing 1 required positional argument: 'target'"),
    ([*REGRESSION, "data.task=classification"], "data.task=classification takes integer class or token ids, but "
                                                "the data's targets are floats: set data.task=regression"),
    ([*REGRESSION[2:], *MODEL], "model=linear outputs [1, 4] for one input, but a regression target is one number: "
                                "the model must output [1] (or [1, 1])"),
])
def test_a_bad_model_or_dataset_is_one_line_before_training(compose_train, tmp_path, overrides, message):
    with pytest.raises(ConfigError) as e:
        _build(compose_train, tmp_path, overrides)
    assert message in str(e.value)


def _fit_alone(compose_train, tmp_path, overrides) -> tuple[float, dict]:
    """One process trains (no torchrun): the held-out loss before the first step, and the summary."""
    cfg = compose_train(list(overrides) + QUICK + ["trainer.amp=off"])
    schema.check(cfg)
    trainer = Trainer.from_config(cfg, DistEnv(0, 1, 0, torch.device("cpu"), "none"), tmp_path)
    try:
        loss_sum, _, n = trainer.evaluate()
        return loss_sum / n, trainer.fit()
    finally:
        trainer.close()


def test_a_regression_trains_by_its_loss_alone_and_its_held_out_loss_falls(compose_train, tmp_path, capsys):
    """y = x . w + noise (std 0.1) under nn.Linear(8, 1): float targets, MSE, the held-out loss reported."""
    before, s = _fit_alone(compose_train, tmp_path, [*REGRESSION, "trainer.epochs=2"])
    assert before > 1.0  # |w|^2 of 8 standard normal weights, from a model near 0
    assert (s["task"], s["test_total"], s["steps"]) == ("regression", 128, 64)  # samples, not correct ones
    assert "test_acc" not in s and "test_correct" not in s
    assert s["test_loss"] < 0.015  # the noise's variance is 0.01: nothing left to learn
    out = capsys.readouterr().out
    assert f"test loss {s['test_loss']:.4g}, {s['sec_per_epoch']:.1f} sec/epoch, " in out
    assert "epoch 2/2  loss " in out and f"test loss {s['test_loss']:.4f}  " in out


def test_a_users_loss_by_target_trains_and_a_max_steps_run_counts_steps(compose_train, tmp_path, capsys):
    huber = ["trainer.loss._target_=torch.nn.HuberLoss", "+trainer.loss.delta=1.0", "trainer.max_steps=40",
             "optim.warmup_epochs=0.5"]  # (40 steps are 1.25 epochs: not all of them warming up)
    before, s = _fit_alone(compose_train, tmp_path, [*REGRESSION, *huber])
    assert s["test_loss"] < 0.05 * before  # the Huber loss: linear past 1, so slower than MSE, still falling
    assert (s["steps"], s["max_steps_cut"]) == (40, True)
    out = capsys.readouterr().out
    assert f"test loss {s['test_loss']:.4g}, 40 steps (trainer.max_steps), {s['step_ms']:,.1f} ms/step, " in out
    assert "step 40/40  loss " in out and "epoch 2/" not in out  # the cut epoch's line counts steps


def test_samples_that_are_dicts_train_by_their_keys(compose_train, tmp_path):
    dicts = [*MODEL, "data=custom", "data._target_=tests.workloads.dict_blobs", "data.batch_size=64",
             "data.input_key=features", "data.target_key=label", "trainer.epochs=2"]
    _, s = _fit_alone(compose_train, tmp_path, dicts)
    assert (s["task"], s["test_total"]) == ("classification", 128) and s["test_acc"] > 0.9


# ---------------------------------------------------------------- under torchrun
def _train(args, nproc=2, env=None, timeout=300):
    proc = run_module("ddp_lab.train", args, nproc=nproc, env=env, timeout=timeout)
    assert proc.returncode == 0, failure(proc)
    return proc


def _scalars(run_dir: Path, tag: str) -> list[float]:
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.value for e in acc.Scalars(tag)]


@pytest.mark.system
def test_vectors_defined_in_a_test_train_on_two_ranks_to_a_set_accuracy(tmp_path):
    _train([*VECTORS, *QUICK, "trainer.epochs=4", "optim.lr=0.05", f"hydra.run.dir={tmp_path}"])
    s = read_summary(tmp_path)
    assert (s["model"], s["data"], s["task"], s["world_size"], s["test_total"]) == (
        "linear", "blobs", "classification", 2, 256)
    assert s["test_acc"] >= 0.95  # four well-separated clusters
    assert s["flops_per_sample"] == 3 * 2 * (8 * 32 + 32 * 4) - 2 * 8 * 32  # forward, weight and input grads
    assert (tmp_path / "checkpoints").is_dir()


@pytest.mark.system
def test_the_example_project_as_the_readme_launches_it_then_resumes_under_another_sync(tmp_path):
    env = {"PYTHONPATH": f"{EXAMPLE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    readme = ["--config-dir", str(EXAMPLE / "conf"), "model=mlp", "data=spirals", "optim=adam", "trainer.epochs=5"]
    assert " ".join(readme[2:]) in (EXAMPLE / "README.md").read_text().replace("\\\n", " ")
    assert "examples/spirals" in (ROOT / "README.md").read_text()
    _train([*readme, *QUICK, f"hydra.run.dir={tmp_path / 'flat'}"], env=env)
    s = read_summary(tmp_path / "flat")
    assert (s["model"], s["sync"].split()[0], s["test_total"]) == ("mlp", "flat/builtin", 2048)
    assert s["test_acc"] >= 0.9

    # another sync and algorithm, stopped and resumed: the same capabilities as ddp_lab's own models
    ring = [*readme, *QUICK, "sync=ddp", "sync.algo=ring", f"hydra.run.dir={tmp_path / 'ring'}"]
    _train([*ring, "trainer.max_steps=50"], env=env)
    assert read_summary(tmp_path / "ring")["steps"] == 50
    again = _train([*ring, "trainer.resume=auto"], env=env)
    assert "resumed" in again.stdout.lower()
    s = read_summary(tmp_path / "ring")
    assert (s["steps"], s["sync"].split()[0]) == (160, "ddp/ring") and s["test_acc"] >= 0.9


@pytest.mark.system
def test_the_gpt_trains_on_two_ranks_and_its_validation_loss_falls(tmp_path):
    words = "the quick brown fox jumps over the lazy dog while data parallel ranks average gradients".split()
    g = torch.Generator().manual_seed(0)
    text = " ".join(words[int(i)] for i in torch.randint(0, len(words), (30000,), generator=g))
    (tmp_path / "corpus.txt").write_text(text)
    run = tmp_path / "run"
    _train(["model=gpt", "data=text", "optim=adamw", f"data.path={tmp_path / 'corpus.txt'}",
            "model.n_layer=2", "model.n_embd=64", "model.block_size=32", "data.batch_size=32",
            "optim.warmup_steps=5", "trainer.max_steps=40", *QUICK, f"hydra.run.dir={run}"])
    s = read_summary(run)
    assert (s["task"], s["steps"], s["world_size"]) == ("language_model", 40, 2)
    assert s["tokens_per_sec"] == pytest.approx(s["samples_per_sec"] * 32) and s["tokens_per_sec"] > 0
    assert 0 < s["mfu"] < 1 and s["flops_per_sample"] > 0
    assert s["val_ppl"] == pytest.approx(2.718281828 ** s["val_loss"])
    losses = _scalars(run, "loss/train_step")
    assert len(losses) == 8 and losses[-1] < 0.7 * losses[0]  # every 5 steps: falling
    assert s["val_loss"] < 4.0  # ln(256) = 5.5 at chance over bytes


@pytest.mark.system
def test_the_scaling_benchmark_takes_the_example_project(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{EXAMPLE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        [sys.executable, "-m", "ddp_lab.tools.bench.scaling", "--worlds", "1,2", "--max-steps", "10", "--repeats", "1",
         "--kinds", "weak", "--out", str(tmp_path), "--", "--config-dir", str(EXAMPLE / "conf"), "model=mlp",
         "data=spirals", "optim=adam"], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.DictReader((tmp_path / "scaling.csv").open()))
    assert [int(r["world_size"]) for r in rows] == [1, 2]
    assert all(json.loads((run / "summary.json").read_text())["model"] == "mlp"
               for run in (tmp_path / "runs").iterdir())


@pytest.mark.system
def test_a_users_transformer_with_a_frozen_part_trains_sharded_by_target(tmp_path):
    """tests/sync/user_model.py's transformer by `_target_` under stage 3: units found (its Layer, two deep),
    its frozen position embedding sharded and untouched, no_decay groups, bf16 weights over an fp32 master,
    every unit checkpointed; model.pt loads into a plain model."""
    from tests.sync.user_model import UserTransformer
    (tmp_path / "corpus.txt").write_text("the quick brown fox jumps over the lazy dog. " * 400)
    run = tmp_path / "run"
    model = ["model=custom", "model._target_=tests.sync.user_model.user_transformer", "+model.vocab=256",
             "+model.d=32", "+model.block=16"]
    proc = _train([*model, "data=text", "data.block_size=16", f"data.path={tmp_path / 'corpus.txt'}", "optim=adamw",
                   "optim.no_decay=1d", "sync=zero", "sync.zero_stage=3", "trainer.amp=bf16",
                   "trainer.activation_checkpointing=units", "data.batch_size=8", "trainer.max_steps=6", *QUICK,
                   f"hydra.run.dir={run}"])
    log = proc.stdout + proc.stderr
    assert "units (auto: the repeated Layer): 3 (3 x Layer;" in log and "recompute their forward" in log
    s = read_summary(run)
    assert (s["steps"], s["sync"].split()[0]) == (6, "zero3/direct")
    weights = torch.load(run / "model.pt", weights_only=True)
    torch.manual_seed(0)  # the run's seed: the same initial weights
    fresh = UserTransformer(vocab=256, d=32, block=16)
    plain = UserTransformer(vocab=256, d=32, block=16)
    plain.load_state_dict(weights)
    assert all(t.dtype == torch.float32 for t in weights.values())  # the fp32 master, not the bf16 gathers
    assert torch.equal(weights["transformer.wpe.weight"], fresh.transformer.wpe.weight)  # frozen
    assert not torch.equal(weights["transformer.h.0.mlp.0.weight"], fresh.transformer.h[0].mlp[0].weight)
