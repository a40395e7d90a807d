"""Choosing a strategy: the config's checks, its presets, sync.mode=auto, one process."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from ddp_lab.config import ConfigError
from ddp_lab.distributed import DistEnv
from ddp_lab.models.lenet import lenet
from ddp_lab.sync import ALGOS, MODES, GradSync, build_sync, resolve_mode, validate
from tests.multiproc import run_in_processes
from tests.sync import sync_cfg

CPU = torch.device("cpu")
CONF = Path(__file__).parents[2] / "conf"


def test_every_combination_is_valid_and_bucket_sizes_are_checked():
    for mode in MODES:
        for algo in ALGOS:
            for compress in ("none", "bf16", "fp16"):
                validate(sync_cfg(mode, algo, compress))
    validate(sync_cfg("flat", bucket_cap_mb=0))  # one buffer
    with pytest.raises(ConfigError, match="must be > 0 with sync.mode=ddp"):
        validate(sync_cfg("ddp", bucket_cap_mb=0))
    with pytest.raises(ConfigError, match="must be >= 0"):
        validate(sync_cfg("per_param", bucket_cap_mb=-1))


def _keys(name: str) -> dict[str, str]:
    """A sync config file's own keys and their lines (its defaults list left out)."""
    lines = (CONF / "sync" / f"{name}.yaml").read_text().splitlines()
    return {ln.split(":")[0]: ln for ln in lines
            if ln and not ln.startswith(("#", " ", "defaults:"))}


# What each preset states on top of base.yaml.
PRESETS = {"auto": {"mode": "auto"}, "ddp": {"mode": "ddp"},
           "flat": {"mode": "flat", "bucket_cap_mb": 0}, "per_param": {"mode": "per_param"}}


@pytest.mark.parametrize("preset", list(PRESETS))
def test_presets_inherit_base_and_state_only_what_differs(compose_train, preset):
    cfg = compose_train([f"sync={preset}", "sync.algo=ring"])
    assert (cfg.sync.mode, cfg.sync.algo) == (preset, "ring")
    validate(cfg.sync)
    assert (CONF / "sync" / f"{preset}.yaml").read_text().count("  - base\n  - _self_\n") == 1
    own = _keys(preset)
    assert set(own) == set(PRESETS[preset]) and all("#" in ln for ln in own.values())
    base = compose_train(["sync=auto"]).sync
    for key, value in cfg.sync.items():
        want = PRESETS[preset].get(key, "ring" if key == "algo" else base[key])
        assert value == want, (preset, key)


def test_base_holds_every_key_with_a_true_choice_list():
    base = _keys("base")
    assert list(base) == ["mode", "algo", "bucket_cap_mb", "gradient_as_bucket_view", "static_graph",
                          "compress", "poll"]
    assert all("#" in ln for ln in base.values())
    comment = {key: ln.split("#", 1)[1] for key, ln in base.items()}
    assert all(m in comment["mode"] for m in ("auto", *MODES))
    listed = [w.split("(")[0].strip() for w in comment["algo"].split(" | ")]
    assert listed == list(ALGOS)
    assert comment["compress"].strip().startswith("none | bf16 | fp16")
    assert comment["poll"].strip().startswith("auto | true | false")


def test_base_alone_is_not_a_preset(compose_train):
    with pytest.raises(ConfigError, match="sync=base only holds the keys the presets share"):
        validate(compose_train(["sync=base"]).sync)


def test_single_process_has_nothing_to_communicate():
    model = lenet()
    sync = build_sync(sync_cfg("flat", "ring"), model, DistEnv(0, 1, 0, CPU, "none"))
    assert type(sync) is GradSync and sync.module is model and sync.describe() == "none"
    assert sync.comm_figures(10, 1.0) == (0.0, 0.0)
    assert all(math.isnan(v) for v in sync.comm_figures(0, 0.0))


def test_auto_mode_is_flat_on_cpu_and_ddp_on_gpus():
    assert resolve_mode("auto", CPU) == "flat"
    assert resolve_mode("auto", torch.device("cuda", 0)) == "ddp"
    assert resolve_mode("per_param", CPU) == "per_param"  # an explicit mode is kept
    assert run_in_processes(_build_auto, 2) == [("FlatSync", "flat/builtin", "auto")] * 2


def _build_auto(rank: int, world_size: int):
    cfg = sync_cfg("auto", bucket_cap_mb=25)
    sync = build_sync(cfg, lenet(), DistEnv(rank, world_size, 0, CPU, "gloo"))
    return type(sync).__name__, sync.describe(), cfg.mode  # the caller's cfg is left as it was
