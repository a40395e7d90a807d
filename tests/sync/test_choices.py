"""Choosing a strategy: the registry, each strategy's keys and rules, its preset, sync=auto, one process."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from ddp_lab.collectives import ALGORITHMS
from ddp_lab.config import ConfigError
from ddp_lab.distributed import DistEnv
from ddp_lab.models.lenet import lenet
from ddp_lab.sync import (
    REGISTRY,
    ReplicaSync,
    SyncOptions,
    build_sync,
    check,
    name_of,
    options_of,
    resolved,
    strategy_class,
)
from ddp_lab.sync.every_step import AutoOptions, DDPOptions, DDPSync, FlatOptions, PerParamOptions, PowerSGDOptions
from ddp_lab.sync.every_step.averaging import AveragingOptions
from ddp_lab.sync.options import Algo, Cast
from ddp_lab.sync.periodic import DiLoCoOptions, PeriodicOptions
from ddp_lab.sync.registry import inner_options
from tests.multiproc import run_in_processes
from tests.sync import sync_cfg

CPU = torch.device("cpu")
CUDA = torch.device("cuda", 0)

# The algorithms a strategy cannot run on refused by its check(); every other strategy takes all of ALGORITHMS.
TAKES = {"powersgd": ("builtin",),  # torch's PowerSGD hook
         "zero": ("builtin", "ring_textbook", "direct"),  # those with a reduce-scatter and an all-gather
         "fsdp": ("builtin", "direct"),  # torch's FSDP2; direct: its reduce-scatter ours
         "ft_ddp": ("builtin",)}  # torch's collectives on each island's group, torchft's across
STRATEGIES = ["auto", "ddp", "flat", "per_param", "powersgd", "local_sgd", "diloco", "ft_ddp", "zero", "fsdp"]
# valid at their defaults (ft_ddp needs the islands planned: sync.max_islands)
DEFAULTS_VALID = [n for n in STRATEGIES if n != "ft_ddp"]
PLANNED = {"ft_ddp": {"max_islands": 2}}  # (what a strategy needs besides its defaults)


def takes(name: str) -> tuple[str, ...]:
    return TAKES.get(name, tuple(ALGORITHMS))


def test_the_registry_holds_every_strategy_and_the_guides_algorithms():
    assert list(REGISTRY) == STRATEGIES
    assert set(TAKES) <= set(REGISTRY)
    assert [a.value for a in Algo] == list(ALGORITHMS)
    assert [n for n, s in REGISTRY.items() if s.inside is not None] == ["ddp", "flat", "zero", "fsdp"]


def test_ft_ddp_at_its_defaults_asks_for_the_islands_planned():
    with pytest.raises(ConfigError, match="set sync.max_islands to their number"):
        check(REGISTRY["ft_ddp"].options())


@pytest.mark.parametrize("name", DEFAULTS_VALID)
def test_every_strategy_is_valid_at_its_defaults_and_named_by_its_options(name):
    opts = REGISTRY[name].options()
    check(opts)
    assert name_of(opts) == name and options_of(opts) is opts
    if REGISTRY[name].inside is not None:  # and inside islands, at its defaults there
        check(DiLoCoOptions(islands="2", inner=inner_options(name)))
        check(REGISTRY["local_sgd"].options(islands="host", inner=inner_options(name)))


@pytest.mark.parametrize("name", STRATEGIES)
def test_each_strategy_takes_the_algorithms_it_can_run_and_refuses_the_others_in_one_line(name):
    for algo in ALGORITHMS:
        opts = sync_cfg(name, algo, **PLANNED.get(name, {}))
        if algo in takes(name):
            check(opts)
            continue
        with pytest.raises(ConfigError, match=rf"^sync.algo={algo} .*: sync={name} takes "
                                              rf"sync.algo={' or '.join(takes(name))}$") as e:
            check(opts)
        assert "\n" not in str(e.value)


def test_every_combination_is_valid_and_bucket_sizes_are_checked():
    every_step = [n for n, s in REGISTRY.items() if issubclass(s.options, AveragingOptions) and n != "powersgd"]
    assert every_step == ["auto", "ddp", "flat", "per_param"]
    for name in every_step:
        for algo in ALGORITHMS:
            for compress in ("none", "bf16", "fp16"):
                check(sync_cfg(name, algo, compress))
    check(sync_cfg("flat", buffer_mb=0))  # one buffer
    check(sync_cfg("zero", bucket_cap_mb=0))  # one bucket
    with pytest.raises(ConfigError, match=r"^sync.bucket_cap_mb=0(\.0)? must be > 0$"):
        check(sync_cfg("ddp", bucket_cap_mb=0))
    for name in ("local_sgd", "diloco"):
        for algo in ALGORITHMS:
            check(sync_cfg(name, algo))
    check(sync_cfg("diloco", compress="bf16"))  # 16-bit changes of the weights
    check(sync_cfg("diloco", compress="int4"))  # and 4-bit ones
    check(sync_cfg("powersgd"))
    assert strategy_class(sync_cfg("powersgd"), CPU) is DDPSync  # the hook runs under DDP
    assert resolved(sync_cfg("powersgd"), CPU) == sync_cfg("powersgd")


@pytest.mark.parametrize("name,algo,compress,says", [
    ("powersgd", "ring", None, r"^sync.algo=ring cannot run inside torch's PowerSGD hook: sync=powersgd takes "
                               r"sync.algo=builtin$"),
    ("powersgd", "builtin", "bf16", r"^sync.compress=bf16: sync=powersgd sends low-rank factors of its own; leave "
                                    r"sync.compress out, or use sync=ddp sync.compress=bf16$"),
    ("diloco", "ring", "int8", r"^sync.algo=ring: DiLoCo's int8/int4, overlap and fragments run on torch's "
                               r"collectives: use sync.algo=builtin$"),
])
def test_combinations_a_strategy_cannot_serve_are_refused_in_one_line(name, algo, compress, says):
    with pytest.raises(ConfigError, match=says) as e:
        check(sync_cfg(name, algo, compress))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name,compress", [("local_sgd", "powersgd"), ("local_sgd", "bf16"), ("zero", "bf16"),
                                           ("fsdp", "fp16")])
def test_a_strategy_that_casts_nothing_takes_no_sync_compress(name, compress):
    with pytest.raises(TypeError, match=rf"^sync={name} takes no compress$"):
        sync_cfg(name, compress=compress)


@pytest.mark.parametrize("name,compress,allowed", [
    ("flat", "powersgd", "none, bf16, fp16"),  # a strategy of its own now: sync=powersgd
    ("ddp", "powersgd", "none, bf16, fp16"),
    ("flat", "int4", "none, bf16, fp16"),  # DiLoCo's outer gradients only
    ("diloco", "powersgd", "none, bf16, fp16, int8, int4"),
])
def test_a_wire_format_a_strategy_does_not_send_is_off_its_list(compose_train, name, compress, allowed):
    with pytest.raises(ConfigCompositionException, match=f"^Error merging override sync.compress={compress}$") as e:
        compose_train([f"sync={name}", f"sync.compress={compress}"])
    assert f"Invalid value '{compress}', expected one of [{allowed}]" in str(e.value.__cause__)


@pytest.mark.parametrize("name", STRATEGIES)
def test_each_preset_is_its_dataclass_at_its_defaults(compose_train, name):
    algo = next(a for a in ("ring", "ring_textbook", "builtin") if a in takes(name))
    planned = [f"sync.{k}={v}" for k, v in PLANNED.get(name, {}).items()]
    cfg = compose_train([f"sync={name}", f"sync.algo={algo}", *planned])
    assert OmegaConf.get_type(cfg.sync) is REGISTRY[name].options
    opts = options_of(cfg.sync)
    check(opts)
    assert (name_of(opts), opts.algo) == (name, algo)
    if isinstance(opts, PeriodicOptions):  # the strategy inside islands composed too: ddp's, at its defaults
        assert opts.inner == inner_options("ddp") == DDPOptions()
        opts = dataclasses.replace(opts, inner=None)
    assert opts == REGISTRY[name].options(algo=algo, **PLANNED.get(name, {}))  # every other key at its default


def test_the_default_strategy_is_auto(compose_train):
    assert name_of(options_of(compose_train().sync)) == "auto"


# Each strategy's own keys, besides those of every strategy (SyncOptions).
TORCHFT = ["fault_tolerance", "lighthouse", "island", "max_islands", "min_islands", "island_timeout_s"]
OWN_KEYS = {
    "auto": ["compress"],
    "ddp": ["compress", "bucket_cap_mb", "gradient_as_bucket_view", "static_graph"],
    "flat": ["compress", "buffer_mb", "overlap_backward"],
    "per_param": ["compress"],
    "powersgd": ["compress", "bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "powersgd_rank",
                 "powersgd_start_step"],
    "local_sgd": ["every", "islands", "inner", *TORCHFT, "local_sgd_start_step"],
    "diloco": ["every", "islands", "inner", *TORCHFT, "compress", "outer_lr", "outer_momentum", "overlap",
               "overlap_mix", "fragments", "overlap_update", "eager_proxy", "rounding"],
    "ft_ddp": ["every", "islands", "inner", *TORCHFT],
    "zero": ["param_dtype", "reduce_dtype", "zero_stage", "bucket_cap_mb", "prefetch", "overlap_reduce"],
    "fsdp": ["param_dtype", "reduce_dtype", "islands", "overlap"],
}


def test_each_strategy_holds_its_own_keys_with_help_and_a_true_choice_list():
    shared = [f.name for f in dataclasses.fields(SyncOptions)]
    assert shared == ["algo", "shard_units", "unit_mb", "poll"]
    assert list(OWN_KEYS) == list(REGISTRY)
    for name, s in REGISTRY.items():
        fields = [f for f in dataclasses.fields(s.options) if f.name != "defaults"]  # (Hydra's, for sync/inner)
        assert [f.name for f in fields] == shared + OWN_KEYS[name], name
        assert all(f.metadata.get("help") for f in fields), name
    helps = {f.name: f.metadata.get("help") for f in dataclasses.fields(DiLoCoOptions)}
    assert [c.value for c in Cast] == ["none", "bf16", "fp16"]
    assert {f.name: f.metadata["help"] for f in dataclasses.fields(FlatOptions)}["compress"].startswith(
        "none | bf16 | fp16")
    assert helps["compress"].startswith("what the outer gradient crosses the wire as: none | bf16 | fp16")
    assert "int8 | int4" in helps["compress"]
    assert "auto" in helps["poll"] and SyncOptions().poll == "false"


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
    assert type(resolved(AutoOptions(), CPU)) is FlatOptions
    assert type(resolved(AutoOptions(), CUDA)) is DDPOptions
    assert resolved(AutoOptions(algo="ring", compress="bf16"), CPU) == FlatOptions(algo="ring", compress="bf16")
    assert resolved(AutoOptions(algo="ring"), CUDA) == DDPOptions(algo="ring")  # its other keys at ddp's defaults
    opts = PerParamOptions()
    assert resolved(opts, CPU) is opts  # an explicit strategy is kept
    assert run_in_processes(_build_auto, 2) == [("FlatSync", "flat/builtin", "auto")] * 2


def _build_auto(rank: int, world_size: int):
    cfg = sync_cfg("auto")
    sync = build_sync(cfg, lenet(), DistEnv(rank, world_size, 0, CPU, "gloo"))
    return type(sync).__name__, sync.describe(), name_of(cfg)  # the caller's options are left as they were


@pytest.mark.parametrize("extra,says", [
    (dict(overlap=2, algo="ring"), r"^sync.algo=ring: DiLoCo's int8/int4, overlap and fragments run on torch's "
                                   r"collectives: use sync.algo=builtin$"),
    (dict(overlap=2, every=2), r"^sync.overlap=2 must be less than sync.every=2: the outer step lands before the "
                               r"next synchronisation$"),
    (dict(fragments=3, algo="ring"), r"^sync.algo=ring: DiLoCo's int8/int4, overlap and fragments run on torch's "
                                     r"collectives: use sync.algo=builtin$"),
    (dict(fragments=3, every=2), r"^sync.fragments=3 must be at most sync.every=2: each fragment synchronises "
                                 r"at its own step of the 2$"),
])
def test_an_overlap_or_fragments_diloco_cannot_serve_is_refused_in_one_line(extra, says):
    with pytest.raises(ConfigError, match=says) as e:
        check(sync_cfg(**{"mode": "diloco", "every": 8, **extra}))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("mode,key", [("flat", "overlap"), ("local_sgd", "overlap"), ("local_sgd", "fragments"),
                                      ("ddp", "fragments")])
def test_overlap_and_fragments_are_diloco_s_keys_alone(compose_train, mode, key):
    with pytest.raises(TypeError, match=rf"^sync={mode} takes no {key}$"):
        sync_cfg(mode, **{key: 2})
    with pytest.raises(ConfigCompositionException, match=rf"Could not override 'sync.{key}'") as e:
        compose_train([f"sync={mode}", f"sync.{key}=2"])
    assert f"Key '{key}' not in '{REGISTRY[mode].options.__name__}'" in str(e.value.__cause__)
    check(sync_cfg("diloco", **{key: 2}))


def test_fragments_cut_the_parameters_into_runs_of_about_equal_size():
    from ddp_lab.sync.periodic.fragments import fragment_bounds
    assert fragment_bounds([48, 8, 8, 24, 3], 1) == [(0, 5)]
    assert fragment_bounds([48, 8, 8, 24, 3], 2) == [(0, 1), (1, 5)]  # 48 | 43
    assert fragment_bounds([10] * 6, 3) == [(0, 2), (2, 4), (4, 6)]
    assert fragment_bounds([100, 1, 1, 1], 3) == [(0, 1), (1, 2), (2, 4)]  # one large: the rest one each
    assert fragment_bounds([1, 1, 1, 100], 3) == [(0, 2), (2, 3), (3, 4)]  # left just enough for one each
    with pytest.raises(ConfigError, match=r"sync.fragments=5 is more than the model's 4 trainable parameter tensors"):
        fragment_bounds([1, 1, 1, 1], 5)


def test_powersgd_is_ddp_with_its_own_keys():
    assert issubclass(PowerSGDOptions, DDPOptions)
    opts = sync_cfg("powersgd", powersgd_rank=4, bucket_cap_mb=0.1)
    check(opts)
    assert (opts.powersgd_rank, opts.powersgd_start_step, opts.bucket_cap_mb) == (4, 100, 0.1)
    with pytest.raises(TypeError, match=r"^sync=ddp takes no powersgd_rank$"):
        sync_cfg("ddp", powersgd_rank=4)
