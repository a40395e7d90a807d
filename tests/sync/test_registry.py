"""Each strategy owns its keys: sync=<name> accepts its own and refuses another's in one line; the registry is
the one place a strategy is listed (a toy one, in one file, trains)."""
import dataclasses
import subprocess
import sys

import pytest
import torch
from hydra.errors import ConfigCompositionException

from ddp_lab.config import ConfigError
from ddp_lab.config.renamed import refuse_renamed
from ddp_lab.distributed import DistEnv
from ddp_lab.sync import REGISTRY, name_of, options_of
from ddp_lab.sync.options import SyncOptions
from ddp_lab.sync.registry import refuse_foreign_keys
from ddp_lab.training.trainer import Trainer
from tests.multiproc import run_in_processes

SHARED = {f.name for f in dataclasses.fields(SyncOptions)}


def own_keys(name: str) -> set[str]:
    return {f.name for f in dataclasses.fields(REGISTRY[name].options) if "help" in f.metadata} - SHARED


def foreign_pairs():
    """(strategy, a key of another strategy it does not take), every such pair."""
    return [(a, k) for a in REGISTRY for b in REGISTRY for k in sorted(own_keys(b) - own_keys(a))
            if a != b and k not in {f.name for f in dataclasses.fields(REGISTRY[a].options)}]


def test_every_strategy_refuses_every_key_of_another_in_one_line():
    pairs = foreign_pairs()
    assert ("ddp", "every") in pairs and ("diloco", "bucket_cap_mb") in pairs and ("flat", "zero_stage") in pairs
    for name, k in pairs:
        with pytest.raises(ConfigError) as e:
            refuse_foreign_keys([f"sync={name}", f"sync.{k}=1"])
        line = str(e.value)
        assert "\n" not in line and line.startswith(f"sync.{k} is not a key of sync={name}; it is a key of sync="), line


def test_hydra_refuses_a_key_of_another_strategy_too(compose_train):
    """Where the one-line check is not run (the compose API, a tool), the strategy's dataclass refuses the key."""
    for name in REGISTRY:
        k = sorted(own_keys("diloco") - own_keys(name) - {f.name for f in dataclasses.fields(REGISTRY[name].options)})
        if k:
            with pytest.raises(ConfigCompositionException, match=k[0]):
                compose_train([f"sync={name}", f"sync.{k[0]}=1"])


def test_each_strategy_takes_its_own_keys_as_short_as_before(compose_train):
    cfg = compose_train(["sync=diloco", "sync.every=4", "sync.compress=int4"])
    opts = options_of(cfg.sync)
    assert (name_of(opts), opts.every, opts.compress) == ("diloco", 4, "int4")
    inner = options_of(compose_train(["sync=diloco", "sync.islands=2", "sync/inner=zero",
                                      "sync.inner.zero_stage=3"]).sync).inner
    assert (name_of(inner), inner.zero_stage, inner.algo) == ("zero", 3, "builtin")
    assert name_of(options_of(compose_train(["sync=diloco", "sync.inner=fsdp"]).sync).inner) == "fsdp"
    assert options_of(compose_train(["sync=zero"]).sync).algo == "direct"  # zero's own default


@pytest.mark.parametrize("override,new", [
    ("sync.mode=diloco", "use sync=<strategy>"), ("trainer.eval_every=2", "trainer.eval_every_epochs"),
    ("trainer.ckpt_every=5", "trainer.ckpt_every_steps")])
def test_an_old_spelling_names_the_new_one(override, new):
    with pytest.raises(ConfigError, match=new):
        refuse_renamed(["model=gpt", override])


def test_the_entry_point_says_it_in_one_line_and_exits_2():
    for args in (["sync=ddp", "sync.every=8"], ["sync.mode=diloco"], ["sync=nosuch"]):
        out = subprocess.run([sys.executable, "-m", "ddp_lab.train", *args], capture_output=True, text=True,
                             timeout=120)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("ddp_lab: error: sync"), out.stderr


def _train_toy(rank: int, world_size: int, overrides: list, run_dir: str) -> tuple:
    from hydra import compose, initialize_config_module

    import tests.sync.toy_strategy  # noqa: F401  (registers sync=toy)
    from ddp_lab.config import schema
    schema.register()
    with initialize_config_module(version_base="1.3", config_module="ddp_lab.conf"):
        cfg = compose(config_name="train", overrides=overrides)
    trainer = Trainer.from_config(cfg, DistEnv(rank, world_size, 0, torch.device("cpu"), "gloo"), run_dir)
    try:
        summary = trainer.fit()
        # (plain lists: a tensor crosses the pipe by a shared file the exiting rank may close first)
        return summary["sync"], summary["train_loss"], [p.detach().tolist() for p in trainer.model.parameters()]
    finally:
        trainer.close()


def test_a_strategy_in_one_file_trains_as_the_mean_would(tmp_path):
    """sync=toy (tests/sync/toy_strategy.py) at scale 1 takes the steps of sync=flat, to the bit's neighbourhood."""
    base = ["model=custom", "model._target_=tests.workloads.linear", "data=custom",
            "data._target_=tests.workloads.blobs",
            "data.batch_size=64", "optim.clip_grad_norm=0",
            "trainer.epochs=1", "trainer.max_steps=6", "trainer.progress=false", "trainer.amp=off",
            "trainer.compile=false", "optim.warmup_epochs=0", "trainer.keep_ckpts=0"]
    toy = run_in_processes(_train_toy, 2, [*base, "sync=toy", "sync.scale=1.0"], str(tmp_path / "toy"), timeout=120)
    flat = run_in_processes(_train_toy, 2, [*base, "sync=flat"], str(tmp_path / "flat"), timeout=120)
    assert toy[0][0] == "toy(scale 1)" and flat[0][0] == "flat/builtin"
    for a, b in zip(toy[0][2], flat[0][2]):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-6)
    assert toy[0][2] == toy[1][2]  # every rank the same weights
