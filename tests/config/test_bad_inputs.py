"""Every bad input: a clear message naming it and the fix, a non-zero exit, no rank left hanging.

A few cases run the real entry point (exit status, torchrun); the rest check
the message where it is raised, which is what the entry point prints.
"""
import os
import subprocess
import sys
import time

import pytest
import torch

from ddp_lab.config import ConfigError, schema
from ddp_lab.distributed import DistEnv, resolve_backend
from ddp_lab.training.trainer import Trainer
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
    (["sync=zero", "sync.bucket_cap_mb=-1"], "sync.bucket_cap_mb=-1.0 must be >= 0"),
    (["sync.poll=sometimes"], "sync.poll=sometimes must be one of auto, true, false"),
    (["dist.timeout_s=0"], "dist.timeout_s=0.0 must be a positive number of seconds"),
    (["data.std=0"], "data.std=0.0 must be a positive, finite number"),
    (["data.num_workers=-1"], "data.num_workers=-1 must be >= 0"),
    # the tiny Fashion-MNIST holds 512 training images
    (["data.batch_size=100000"], "data.batch_size=100000 is more than the training set's 512 samples: "
                                 "a global batch is at most 512; lower data.batch_size"),
    (["data=synthetic", "data.num_train=50"],
     "data.batch_size=64 is more than the training set's 50 samples (data.num_train=50): a global batch is "
     "at most 50; lower data.batch_size (or raise data.num_train to 64)"),
    (["data=synthetic", "data.num_classes=20"],
     "data.num_classes=20 is more than model.num_classes=10, the classes model=lenet_fast predicts: "
     "set model.num_classes=20 (or data.num_classes<=10)"),
    (["model.num_classes=5"], "model.num_classes=5 is fewer than the 10 classes of the data: "
                              "set model.num_classes=10"),
    (["data=synthetic", "model=lenet", "data.image_shape=[1,8,8]"],
     "data.image_shape=[1, 8, 8] is too small for model=lenet: the smallest image it takes is [1, 26, 26] "
     "and the largest [1, 29, 29]; set data.image_shape=[1, 26, 26] (or use another model)"),
    (["data=synthetic", "data.image_shape=[1,32,32]"],  # LeNet's first linear layer wants 4x4 maps
     "data.image_shape=[1, 32, 32] does not fit model=lenet_fast (a and b must have same reduction dim"),
])
def test_bad_value_message(tiny_fmnist, tmp_path, compose_train, extra, message):
    overrides = [a for a in tiny_overrides(tiny_fmnist, tmp_path) if not a.startswith("hydra.")]
    cfg = compose_train(overrides + extra)
    with pytest.raises(ConfigError) as e:
        # What the entry point does, in its order: the schema's ranges, the backend, the Trainer.
        schema.check(cfg)
        resolve_backend(cfg.dist.backend, torch.device("cpu"))
        Trainer.from_config(cfg, DistEnv(0, 1, 0, torch.device("cpu"), "none"), tmp_path).close()
    assert message in str(e.value)


def test_sync_bn_on_cpu_ranks_is_refused_before_any_collective(tiny_fmnist, tmp_path, compose_train):
    overrides = [a for a in tiny_overrides(tiny_fmnist, tmp_path) if not a.startswith("hydra.")]
    cfg = compose_train(overrides + ["model=resnet18", "model.sync_bn=true"])
    # Rank 0 of 2 with no process group: the check must come before DDP needs one.
    with pytest.raises(ConfigError, match="model.sync_bn=true needs GPU ranks"):
        Trainer.from_config(cfg, DistEnv(0, 2, 0, torch.device("cpu"), "gloo"), tmp_path).close()
    Trainer.from_config(cfg, DistEnv(0, 1, 0, torch.device("cpu"), "none"), tmp_path).close()  # alone: fine


@pytest.mark.system
@pytest.mark.parametrize("extra,message", [  # (Hydra's refusals, the schema's types: one case of each kind)
    (["trainer.epoch=3"], "Could not override 'trainer.epoch': Key 'epoch' not in 'TrainerConfig'"),
    (["trainer.amp=bf61"], "Invalid value 'bf61', expected one of [auto, bf16, fp16, off]"),
    (["trainer.grad_accum=0"], "trainer.grad_accum=0 must be >= 1"),
])
def test_entry_point_exits_non_zero_with_the_message(tiny_fmnist, tmp_path, extra, message):
    proc, _, _ = _run(tiny_fmnist, tmp_path, extra)
    _one_error_line(proc, message)


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


def test_resnet_takes_small_images_and_lenet_its_own_sizes(tiny_fmnist, tmp_path, compose_train):
    """The dry forward refuses only what the model cannot run."""
    overrides = [a for a in tiny_overrides(tiny_fmnist, tmp_path) if not a.startswith("hydra.")]
    for extra in (["model=resnet18", "data.image_shape=[1,8,8]"], ["model=lenet", "data.image_shape=[1,29,29]"],
                  ["model.num_classes=12", "data.num_classes=12"]):
        cfg = compose_train(overrides + ["data=synthetic", "data.num_train=64", "data.num_test=8"] + extra)
        Trainer.from_config(cfg, DistEnv(0, 1, 0, torch.device("cpu"), "none"), tmp_path).close()


def _one_error_line(proc, message: str) -> None:
    """Exit 2, the message as the one `ddp_lab: error:` line on stderr, no traceback."""
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ddp_lab: error:")]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(errors) == 1 and message in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


SYNTHETIC = ["data=synthetic", "data.num_train=2048", "data.num_test=256", "trainer.compile=false"]


@pytest.mark.parametrize("extra,message", [
    (["data.batch_size=1000000000"], "data.batch_size=1000000000 is more than the training set's 2048 samples "
                                     "(data.num_train=2048): a global batch is at most 2048"),
    (["data.num_train=100", "data.batch_size=512"], "data.batch_size=512 is more than the training set's 100 "
                                                    "samples (data.num_train=100): a global batch is at most 100"),
    (["data.num_classes=20"], "data.num_classes=20 is more than model.num_classes=10"),
    (["model=lenet", "data.image_shape=[1,8,8]"], "data.image_shape=[1, 8, 8] is too small for model=lenet: "
                                                  "the smallest image it takes is [1, 26, 26]"),
    (["data.loader=dataloader", "data.num_workers=-1"], "data.num_workers=-1 must be >= 0"),
    (["dist.timeout_s=0"], "dist.timeout_s=0.0 must be a positive number of seconds"),
])
def test_data_the_model_cannot_take_stops_before_training(tiny_fmnist, tmp_path, compose_train, extra, message):
    """Refused while the run is built, before any step (the entry point's one line and exit 2 for such a
    refusal: test_a_refusal_at_build_is_one_line_and_exit_2, and under torchrun below)."""
    overrides = [a for a in tiny_overrides(tiny_fmnist, tmp_path / "run") if not a.startswith("hydra.")]
    with pytest.raises(ConfigError) as e:
        Trainer.from_config(compose_train(overrides + SYNTHETIC + extra),
                            DistEnv(0, 1, 0, torch.device("cpu"), "none"), tmp_path / "run").close()
    assert message in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "run" / "summary.json").exists()


@pytest.mark.system
def test_a_refusal_at_build_is_one_line_and_exit_2(tiny_fmnist, tmp_path):
    proc, _, _ = _run(tiny_fmnist, tmp_path, SYNTHETIC + ["data.num_train=100", "data.batch_size=512"])
    _one_error_line(proc, "data.batch_size=512 is more than the training set's 100 samples")
    assert not (tmp_path / "run" / "summary.json").exists()


TORCHRUN_SAYS = "launch with torchrun, which sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT"


LAUNCH_ENVS = [
    ({"RANK": "1", "WORLD_SIZE": "1"}, "RANK=1 with WORLD_SIZE=1: a rank must be below the world size (0..0)"),
    # with a store address, rank 1 used to wait dist.timeout_s (300 s) for a rank 0 that never comes
    ({"RANK": "1", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"},
     "RANK=1 with WORLD_SIZE=1"),
    ({"RANK": "one", "WORLD_SIZE": "2"}, "RANK=one must be an integer >= 0"),
    ({"RANK": "0"}, "RANK=0 is set but WORLD_SIZE is not"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, "WORLD_SIZE=2 but MASTER_ADDR and MASTER_PORT are not set"),
]
LAUNCH_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.mark.parametrize("env,message", LAUNCH_ENVS)
def test_a_launch_environment_torchrun_did_not_make_is_refused(monkeypatch, env, message):
    from ddp_lab.distributed import launch_env
    for key in LAUNCH_KEYS:
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError) as e:
        launch_env()
    assert message in str(e.value) and TORCHRUN_SAYS in str(e.value)


@pytest.mark.system
def test_the_entry_point_refuses_such_a_launch_at_once(tmp_path):
    """The case that used to wait dist.timeout_s, through the entry point: one line, exit 2, at once."""
    env, message = LAUNCH_ENVS[1]
    full_env = {k: v for k, v in os.environ.items() if k not in LAUNCH_KEYS}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "ddp_lab.train", *SYNTHETIC, f"hydra.run.dir={tmp_path}/run"],
                          capture_output=True, text=True, timeout=120, env={**full_env, **env})
    _one_error_line(proc, message)
    assert TORCHRUN_SAYS in proc.stderr
    assert time.monotonic() - start < 60  # refused at once, not after dist.timeout_s


@pytest.mark.system
def test_data_the_model_cannot_take_under_torchrun_stops_every_rank(tiny_fmnist, tmp_path):
    proc, _, seconds = _run(tiny_fmnist, tmp_path, SYNTHETIC + ["data.num_classes=20"], nproc=2)
    errors = {line for line in proc.stderr.splitlines() if line.startswith("ddp_lab: error:")}
    assert proc.returncode != 0
    assert errors == {"ddp_lab: error: data.num_classes=20 is more than model.num_classes=10, the classes "
                      "model=lenet_fast predicts: set model.num_classes=20 (or data.num_classes<=10)"}
    for rank in (0, 1):  # each rank refused it on its own, before any collective
        assert "data.num_classes=20 is more than" in (tmp_path / "run" / f"rank{rank}.log").read_text()
    assert seconds < 100  # no rank waited for one that had stopped


COMPOSITION = [
    (["model=nosuch"], "model=nosuch: no such preset; choose among custom, gpt, gpt2, gpt_small,"),
    (["trainer.max_steps=abc"], "Error merging override trainer.max_steps=abc: Value 'abc' of type 'str' could not "
                                "be converted to Integer"),
    (["sync=zero", "sync.prefetch=maybe"], "Error merging override sync.prefetch=maybe: Value 'maybe' is not a "
                                           "valid bool"),
]


@pytest.mark.parametrize("overrides,message", COMPOSITION)
def test_what_hydra_cannot_compose_is_said_in_one_line(compose_train, overrides, message):
    from ddp_lab.config.composition import COMPOSITION_ERRORS, composition_error
    with pytest.raises(COMPOSITION_ERRORS) as e:
        compose_train(overrides)
    said = composition_error(e.value)
    assert said.startswith(message) and "\n" not in said, said


@pytest.mark.system
def test_the_entry_point_says_a_composition_error_in_one_line(tmp_path):
    """Hydra's own report runs to 20 lines for a missing preset: the entry point's is one, exit 2."""
    proc = run_module("ddp_lab.train", ["model=nosuch", f"hydra.run.dir={tmp_path / 'run'}"], nproc=0, timeout=120)
    _one_error_line(proc, COMPOSITION[0][1])
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "run").exists()


@pytest.mark.parametrize("composed", [False, True])
def test_only_an_error_before_the_config_is_composed_is_said_as_a_bad_input(monkeypatch, capsys, composed):
    """An OmegaConf error inside the run (code reading a key that is not there) is a bug: its traceback, not a
    bad input's one line and exit 2."""
    from omegaconf.errors import ConfigKeyError

    import ddp_lab.train as train

    def task():
        train.composed = composed
        raise ConfigKeyError("Key 'nosuch' is not in struct")
    monkeypatch.setattr(train, "main", task)
    monkeypatch.setattr(train, "composed", False)
    monkeypatch.setenv("HYDRA_FULL_ERROR", "0")  # (restored after: the entry point sets it)
    if composed:
        with pytest.raises(ConfigKeyError):
            train.composed_or_refused()
    else:
        with pytest.raises(SystemExit) as e:
            train.composed_or_refused()
        assert e.value.code == 2
        assert capsys.readouterr().err == "ddp_lab: error: Key 'nosuch' is not in struct\n"
