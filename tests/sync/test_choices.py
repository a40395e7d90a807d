"""Choosing a strategy: the config's checks, its presets, sync.mode=auto, one process."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException

from ddp_lab.config import ConfigError
from ddp_lab.config.schema import Algo, SyncConfig
from ddp_lab.distributed import DistEnv
from ddp_lab.models.lenet import lenet
from ddp_lab.sync import ALGOS, MODES, PERIODIC, SHARDED, ReplicaSync, build_sync, resolve_mode, resolved_mode, validate
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
    for mode in PERIODIC:
        for algo in ALGOS:
            validate(sync_cfg(mode, algo))
    validate(sync_cfg("diloco", compress="bf16"))  # 16-bit changes of the weights
    validate(sync_cfg("diloco", compress="int4"))  # and 4-bit ones
    validate(sync_cfg("auto", compress="powersgd"))
    assert resolved_mode(sync_cfg("auto", compress="powersgd"), CPU) == "ddp"  # the hook runs under DDP


@pytest.mark.parametrize("mode,algo,compress,says", [
    ("flat", "builtin", "powersgd", "takes sync.mode=ddp .or auto. and sync.algo=builtin, not sync.mode=flat"),
    ("ddp", "ring", "powersgd", "not sync.mode=ddp sync.algo=ring"),
    ("local_sgd", "builtin", "powersgd", "not sync.mode=local_sgd"),
    ("diloco", "builtin", "powersgd", "not sync.mode=diloco"),
    ("local_sgd", "builtin", "bf16", "would round the weights themselves"),
    ("flat", "builtin", "int4", "sync.compress=int4 sends DiLoCo's outer gradients .*: it takes sync.mode=diloco"),
    ("diloco", "ring", "int8", "sync.algo=builtin, not sync.mode=diloco sync.algo=ring"),
])
def test_combinations_a_strategy_cannot_serve_are_refused_in_one_line(mode, algo, compress, says):
    with pytest.raises(ConfigError, match=says) as e:
        validate(sync_cfg(mode, algo, compress))
    assert "\n" not in str(e.value)


def _keys(name: str) -> dict[str, str]:
    """A sync preset's own keys and their lines."""
    lines = (CONF / "sync" / f"{name}.yaml").read_text().splitlines()
    return {ln.split(":")[0]: ln for ln in lines if ln and not ln.startswith(("#", " "))}


# What each preset states on top of the schema's defaults (ddp_lab/config/schema.py).
PRESETS = {"auto": {"mode": "auto"}, "ddp": {"mode": "ddp"},
           "flat": {"mode": "flat", "bucket_cap_mb": 0}, "per_param": {"mode": "per_param"},
           "local_sgd": {"mode": "local_sgd"}, "diloco": {"mode": "diloco"},
           "powersgd": {"mode": "ddp", "compress": "powersgd"}}


@pytest.mark.parametrize("preset", list(PRESETS))
def test_presets_state_only_what_differs_from_the_schema(compose_train, preset):
    algo = "builtin" if preset == "powersgd" else "ring"
    cfg = compose_train([f"sync={preset}", f"sync.algo={algo}"])
    assert (cfg.sync.mode, cfg.sync.algo) == (PRESETS[preset]["mode"], algo)
    validate(cfg.sync)
    own = _keys(preset)
    assert set(own) == set(PRESETS[preset]) and all("#" in ln for ln in own.values())
    defaults = SyncConfig()
    for key, value in cfg.sync.items():
        want = PRESETS[preset].get(key, algo if key == "algo" else getattr(defaults, key))
        assert value == want, (preset, key)


def test_the_schema_holds_every_sync_key_with_a_true_choice_list():
    fields = {f.name: f.metadata["help"] for f in dataclasses.fields(SyncConfig)}
    assert list(fields) == ["mode", "algo", "bucket_cap_mb", "gradient_as_bucket_view", "static_graph",
                            "compress", "powersgd_rank", "powersgd_start_step", "zero_stage", "shard_units", "unit_mb",
                            "param_dtype", "reduce_dtype", "prefetch", "every", "local_sgd_start_step", "outer_lr",
                            "outer_momentum", "overlap", "overlap_mix", "fragments", "overlap_update", "eager_proxy",
                            "rounding", "islands", "inner", "poll"]
    assert all(m in fields["mode"] for m in ("auto", *MODES, *PERIODIC, *SHARDED))
    assert [a.value for a in Algo] == list(ALGOS)
    assert fields["compress"].startswith("none | bf16 | fp16") and "powersgd" in fields["compress"]
    assert "auto" in fields["poll"] and SyncConfig().poll == "false"


def test_base_is_no_longer_a_preset(compose_train):
    with pytest.raises(ConfigCompositionException, match="sync/base"):
        compose_train(["sync=base"])


def test_single_process_has_nothing_to_communicate():
    model = lenet()
    sync = build_sync(sync_cfg("flat", "ring"), model, DistEnv(0, 1, 0, CPU, "none"))
    assert type(sync) is ReplicaSync and sync.module is model and sync.describe() == "none"
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


@pytest.mark.parametrize("extra,says", [
    (dict(overlap=2, mode="flat"), r"sync.overlap=2 sends DiLoCo's outer gradient in the background .* "
                                   r"not sync.mode=flat"),
    (dict(overlap=2, algo="ring"), r"sync.overlap=2 sends .* on torch's collectives: .* not sync.mode=diloco "
                                   r"sync.algo=ring$"),
    (dict(overlap=2, every=2), r"sync.overlap=2 must be less than sync.every=2"),
    (dict(fragments=3, mode="local_sgd"), r"sync.fragments=3 staggers DiLoCo's outer syncs .* not "
                                          r"sync.mode=local_sgd"),
    (dict(fragments=3, algo="ring"), r"sync.fragments=3 staggers .* on torch's collectives: .* sync.algo=ring$"),
    (dict(fragments=3, every=2), r"sync.fragments=3 must be at most sync.every=2: each fragment synchronises "
                                 r"at its own step"),
])
def test_an_overlap_or_fragments_diloco_cannot_serve_is_refused_in_one_line(extra, says):
    with pytest.raises(ConfigError, match=says) as e:
        validate(sync_cfg(**{"mode": "diloco", "every": 8, **extra}))
    assert "\n" not in str(e.value)


def test_fragments_cut_the_parameters_into_runs_of_about_equal_size():
    from ddp_lab.sync.periodic.diloco import fragment_bounds
    assert fragment_bounds([48, 8, 8, 24, 3], 1) == [(0, 5)]
    assert fragment_bounds([48, 8, 8, 24, 3], 2) == [(0, 1), (1, 5)]  # 48 | 43
    assert fragment_bounds([10] * 6, 3) == [(0, 2), (2, 4), (4, 6)]
    assert fragment_bounds([100, 1, 1, 1], 3) == [(0, 1), (1, 2), (2, 4)]  # one large: the rest one each
    assert fragment_bounds([1, 1, 1, 100], 3) == [(0, 2), (2, 3), (3, 4)]  # left just enough for one each
    with pytest.raises(ConfigError, match=r"sync.fragments=5 is more than the model's 4 trainable parameter tensors"):
        fragment_bounds([1, 1, 1, 1], 5)
