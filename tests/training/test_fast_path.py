"""The fast-path knobs each still train: bf16 autocast, channels_last, torch.compile.

Each case builds a Trainer in-process on the tiny Fashion-MNIST, measures the
loss on a fixed set of training batches, trains two short epochs, and checks
that the knob is really in effect and that the same batches' loss fell.
"""
import math
import os
from contextlib import contextmanager

import pytest
import torch

from ddp_lab.distributed import DistEnv
from ddp_lab.training import fast_path
from ddp_lab.training.fast_path import AUTO_COMPILE_MIN_IMAGES, resolve_compile
from ddp_lab.training.trainer import Trainer
from tests.conftest import tiny_overrides

ALONE = DistEnv(0, 1, 0, torch.device("cpu"), "none")


@torch.no_grad()
def probe_loss(trainer, batches) -> float:
    """Mean loss of `batches` under the trainer's autocast, eval mode.

    Through the uncompiled model: the same weights, without a second compile for eval mode.
    """
    trainer.model.eval()
    total = 0.0
    for x, y in batches:
        with trainer.autocast():
            out = trainer.model(x)
        total += trainer.task.loss(out, y).item()
    trainer.model.train()
    return total / len(batches)


@contextmanager
def trained_with(compose_train, tiny_fmnist, tmp_path, knobs, epochs=2):
    """A trainer after `epochs` epochs with `knobs`, open for inspection (close() drops its forward)."""
    overrides = tiny_overrides(tiny_fmnist, tmp_path / "run") + [
        f"trainer.epochs={epochs}", "trainer.threads=1", "trainer.eval_every_epochs=0", *knobs]
    trainer = Trainer.from_config(compose_train(overrides), ALONE, tmp_path / "run")
    batches = list(trainer.train_loader.epoch(0))[:3]
    try:
        before = probe_loss(trainer, batches)
        summary = trainer.fit()
        after = probe_loss(trainer, batches)
        yield trainer, summary, before, after, batches
    finally:
        trainer.close()


def assert_learned(summary, before, after):
    assert before == pytest.approx(math.log(10), abs=0.3)  # untrained: near-uniform outputs
    assert after < before - 0.5, (before, after)
    assert summary["train_loss"] < before
    assert summary["test_acc"] > 0.5  # the tiny set is easy: a bar per class


def test_bf16_autocast_trains(compose_train, tiny_fmnist, tmp_path):
    with trained_with(compose_train, tiny_fmnist, tmp_path,
                      ["trainer.amp=bf16", "trainer.channels_last=false"]) as trained:
        trainer, summary, before, after, batches = trained
        assert trainer.amp == "bf16" and summary["amp"] == "bf16"
        with trainer.autocast():
            assert trainer.forward(batches[0][0]).dtype == torch.bfloat16
        assert all(p.dtype == torch.float32 for p in trainer.model.parameters())  # fp32 master weights
    assert_learned(summary, before, after)


def test_channels_last_trains(compose_train, tiny_fmnist, tmp_path):
    with trained_with(compose_train, tiny_fmnist, tmp_path,
                      ["trainer.amp=off", "trainer.channels_last=true"]) as trained:
        trainer, summary, before, after, batches = trained
    conv = trainer.model[3].weight
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    assert batches[0][0].is_contiguous(memory_format=torch.channels_last)
    assert summary["amp"] == "off"
    assert_learned(summary, before, after)


CPU = torch.device("cpu")


def test_compile_setting_true_false_and_auto(monkeypatch):
    monkeypatch.setattr(fast_path, "inductor_available", lambda device: True)
    assert resolve_compile(True, CPU, 10)[0] is True  # Hydra may hand over a bool ...
    assert resolve_compile("True", CPU, 10)[0] is True  # ... or its str() in a str field
    assert resolve_compile("false", CPU, 10 ** 6)[0] is False
    on, why = resolve_compile("auto", CPU, AUTO_COMPILE_MIN_IMAGES)
    assert on and "auto: on" in why
    on, why = resolve_compile("auto", CPU, AUTO_COMPILE_MIN_IMAGES - 1)
    assert not on and f"{AUTO_COMPILE_MIN_IMAGES - 1:,} samples per rank are too few" in why
    monkeypatch.setattr(fast_path, "inductor_available", lambda device: False)
    on, why = resolve_compile("auto", CPU, 10 ** 6)
    assert not on and "needs a C++ compiler" in why


def test_inductor_available_looks_for_a_cpp_compiler(monkeypatch):
    monkeypatch.setattr(fast_path.shutil, "which", lambda name: None)
    assert not fast_path.inductor_available(CPU)
    monkeypatch.setattr(fast_path.shutil, "which",
                        lambda name: "/usr/bin/clang++" if name == "clang++" else None)
    assert fast_path.inductor_available(CPU)


def test_short_runs_are_not_compiled_by_default(compose_train, tiny_fmnist, tmp_path):
    cfg = compose_train(tiny_overrides(tiny_fmnist, tmp_path / "run"))
    assert cfg.trainer.compile == "auto"
    trainer = Trainer.from_config(cfg, ALONE, tmp_path / "run")
    try:
        assert trainer.compiled is False and trainer.forward is trainer.model
    finally:
        trainer.close()


@pytest.mark.system  # torch.compile's first step generates and compiles C++: tens of seconds
def test_compile_trains(compose_train, tiny_fmnist, tmp_path):
    with trained_with(compose_train, tiny_fmnist, tmp_path,
                      ["trainer.compile=true", "trainer.amp=bf16", "trainer.channels_last=true"]) as trained:
        trainer, summary, before, after, _ = trained
        assert isinstance(trainer.forward, torch._dynamo.eval_frame.OptimizedModule)
    assert summary["compile"] is True
    assert_learned(summary, before, after)


def test_the_amp_decision_is_said_in_one_line():
    from ddp_lab.training.fast_path import amp_reason
    assert amp_reason("auto", "off", CPU) == ("trainer.amp=auto: off, this CPU has no native bf16 "
                                              "(avx512_bf16 or AMX)")
    assert amp_reason("auto", "bf16", CPU) == ("trainer.amp=auto: bf16, this CPU runs bf16 "
                                               "natively (avx512_bf16 or AMX)")
    assert amp_reason("bf16", "bf16", CPU) == "trainer.amp=bf16"


def test_each_rank_compiles_into_its_own_cache_unless_the_user_chose_one(monkeypatch):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from ddp_lab.training.fast_path import own_compile_cache
    default = default_cache_dir()
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert own_compile_cache(3) == os.path.join(default, "rank3")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == os.path.join(default, "rank3")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default)  # what importing inductor sets
    assert own_compile_cache(1) == os.path.join(default, "rank1")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere/shared")  # the user's choice
    assert own_compile_cache(1) is None
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/somewhere/shared"
