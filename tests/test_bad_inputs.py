"""Every bad input: a clear message naming it and the fix, a non-zero exit, no rank left hanging.

A few cases run the real entry point (exit status, torchrun); the rest check
the message where it is raised, which is what the entry point prints.
"""
import time

import pytest
import torch

from ddp_lab import schema
from ddp_lab.config import ConfigError
from ddp_lab.distributed import DistEnv, resolve_backend
from ddp_lab.trainer import Trainer
from tests.conftest import run_module, tiny_overrides


def _run(tiny_fmnist, tmp_path, extra, nproc=0, timeout=120):
    args = tiny_overrides(tiny_fmnist, tmp_path / "run") + list(extra)
    start = time.monotonic()
    proc = run_module("ddp_lab.train", args, nproc=nproc, timeout=timeout)
    return proc, proc.stdout + proc.stderr, time.monotonic() - start


@pytest.mark.parametrize("extra,message", [
    (["dist.backend=nccl"], "dist.backend=nccl needs CUDA devices"),
    (["trainer.amp=fp16"], "trainer.amp=fp16 needs CUDA; on CPU use trainer.amp=bf16 or off"),
    (["trainer.compile=maybe"], "trainer.compile=maybe must be one of auto, true, false"),
    (["data.batch_size=0"], "data.batch_size=0 must be a positive global batch size"),
    (["model.in_channels=3"], "model.in_channels=3 but the data has 1 channel(s); set model.in_channels=1"),
    (["trainer.grad_accum=0"], "trainer.grad_accum=0 must be >= 1"),
    (["data=synthetic", "data.image_shape=[28,28]"], "data.image_shape=[28, 28] must be [channels, height, width]"),
    (["data=synthetic", "data.num_test=0"], "data.num_test=0 must be >= 1"),
    (["trainer.grad_accum=100000"], "trainer.grad_accum=100000 takes 100000 batches per optimizer step, "
                                    "but each rank has only"),
    (["trainer.threads=-1"], "trainer.threads=-1 must be >= 0"),
    (["optim.warmup_epochs=-1"], "optim.warmup_epochs=-1.0 must be >= 0"),
    (["optim.lr=-1"], "optim.lr=-1.0 must be a positive, finite number (e.g. optim.lr=0.1)"),
    (["optim.lr=nan"], "optim.lr=nan must be a positive, finite number"),
    (["optim.lr=0"], "optim.lr=0.0 must be a positive, finite number"),
    (["optim.weight_decay=-1"], "optim.weight_decay=-1.0 must be >= 0"),
    (["optim.momentum=0"], "optim: torch.optim.SGD refused these settings: Nesterov momentum requires a momentum"),
    (["trainer.profile=true", "trainer.profile_active=0"], "trainer.profile_active=0 must be >= 1"),
    (["sync.bucket_cap_mb=-1"], "sync.bucket_cap_mb=-1.0 must be >= 0"),
    (["sync.poll=sometimes"], "sync.poll=sometimes must be one of auto, true, false"),
    (["dist.timeout_s=0"], "dist.timeout_s=0.0 must be a positive number of seconds"),
    (["data.std=0"], "data.std=0.0 must be a positive, finite number"),
    (["model=resnet18", "model.crop_unused_border=true"],
     "model.crop_unused_border does not apply to model 'resnet18'; drop the override"),
])
def test_bad_value_message(tiny_fmnist, tmp_path, compose_train, extra, message):
    overrides = [a for a in tiny_overrides(tiny_fmnist, tmp_path) if not a.startswith("hydra.")]
    cfg = compose_train(overrides + extra)
    with pytest.raises(ConfigError) as e:
        # What the entry point does, in its order: the schema's ranges, the backend, the Trainer.
        schema.check(cfg)
        resolve_backend(cfg.dist.backend, torch.device("cpu"))
        Trainer(cfg, DistEnv(0, 1, 0, torch.device("cpu"), "none"), tmp_path).close()
    assert message in str(e.value)


def test_sync_bn_on_cpu_ranks_is_refused_before_any_collective(tiny_fmnist, tmp_path, compose_train):
    overrides = [a for a in tiny_overrides(tiny_fmnist, tmp_path) if not a.startswith("hydra.")]
    cfg = compose_train(overrides + ["model=resnet18", "model.sync_bn=true"])
    # Rank 0 of 2 with no process group: the check must come before DDP needs one.
    with pytest.raises(ConfigError, match="model.sync_bn=true needs GPU ranks"):
        Trainer(cfg, DistEnv(0, 2, 0, torch.device("cpu"), "gloo"), tmp_path).close()
    Trainer(cfg, DistEnv(0, 1, 0, torch.device("cpu"), "none"), tmp_path).close()  # alone: fine


@pytest.mark.system
@pytest.mark.parametrize("extra,message,code", [
    (["trainer.epoch=3"], "Key 'epoch' not in 'TrainerConfig'", 1),
    (["trainer.epochs=ten"], "Value 'ten' of type 'str' could not be converted to Integer", 1),
    (["trainer.amp=bf61"], "Invalid value 'bf61', expected one of [auto, bf16, fp16, off]", 1),
    (["trainer.grad_accum=0"], "ddp_lab: error: trainer.grad_accum=0 must be >= 1", 2),
])
def test_entry_point_exits_non_zero_with_the_message(tiny_fmnist, tmp_path, extra, message, code):
    proc, out, _ = _run(tiny_fmnist, tmp_path, extra)
    assert proc.returncode == code, out[-2000:]
    assert message in out


@pytest.mark.system
def test_missing_data_names_the_path_and_the_fixes(tmp_path):
    proc = run_module("ddp_lab.train", [f"data.root={tmp_path}/absent", f"hydra.run.dir={tmp_path}/r"],
                      nproc=0, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2
    assert f"data.root={tmp_path}/absent: no Fashion-MNIST files there" in out
    assert "data.download=true" in out


@pytest.mark.system
def test_indivisible_batch_under_torchrun_stops_every_rank(tiny_fmnist, tmp_path):
    proc, out, seconds = _run(tiny_fmnist, tmp_path, ["data.batch_size=64"], nproc=3)
    assert proc.returncode != 0
    assert "data.batch_size=64 is the GLOBAL batch and must divide evenly over 3 ranks" in out
    assert "use a multiple of 3 (e.g. 63 or 66)" in out
    assert seconds < 100  # nobody waited for a collective that never comes
