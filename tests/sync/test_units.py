"""sync.shard_units: the units zero stage 3 and fsdp gather one at a time, found for any module tree
(sync/sharded/units.py), and a parameter read outside its unit refused in one line (outside_use.py)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from ddp_lab.config import ConfigError
from ddp_lab.distributed import DistEnv
from ddp_lab.models.gpt import gpt
from ddp_lab.models.lenet import lenet
from ddp_lab.sync import build_sync
from ddp_lab.sync.sharded.units import describe, unit_modules, warning
from tests.multiproc import run_in_processes
from tests.sync import sync_cfg
from tests.sync.user_model import Layer, ReadsAChild, UserTransformer


def names(model, units):
    of = {id(m): n for n, m in model.named_modules()}
    return [of[id(m)] for m in units]


def test_the_repeated_block_is_found_at_any_depth():
    user = UserTransformer(n_layer=3)
    assert names(user, unit_modules(user)) == ["transformer.h.0", "transformer.h.1", "transformer.h.2"]
    assert all(isinstance(m, Layer) for m in unit_modules(user))  # (not its Attention: fewer parameters)
    ours = gpt(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=16)
    assert names(ours, unit_modules(ours)) == ["blocks.0", "blocks.1"]


def test_without_a_repeated_block_units_go_by_size():
    net = lenet()  # a Sequential of torch's layers: no block class; every layer well under 100 MB
    assert [type(m).__name__ for m in unit_modules(net)] == ["Conv2d", "Conv2d", "Linear", "Linear"]
    deep = nn.Sequential(nn.Sequential(nn.Linear(512, 512), nn.Linear(512, 512)), nn.Linear(512, 2))
    assert unit_modules(deep, unit_mb=100) == [deep[0], deep[1]]  # the inner Sequential fits: one unit
    assert unit_modules(deep, unit_mb=1.5) == [deep[0][0], deep[0][1], deep[1]]  # 2 MB: opened
    assert unit_modules(deep, unit_mb=0.5) == [deep[0][0], deep[0][1], deep[1]]  # a 1 MB layer stays one unit


def test_class_names_pick_the_outermost_and_a_wrong_name_is_refused():
    user = UserTransformer(n_layer=2)
    assert names(user, unit_modules(user, "Layer,Linear")) == ["transformer.h.0", "transformer.h.1"]
    with pytest.raises(ConfigError, match=r"^sync.shard_units=Blok names no module of this model: its classes are "
                                          r"Attention, .*Layer.* \(or sync.shard_units=auto\)$"):
        unit_modules(user, "Blok")


def test_the_log_names_the_units_and_warns_of_one_holding_most():
    user = UserTransformer(n_layer=3)
    line = describe(user, unit_modules(user))
    assert line.startswith("units (auto: the repeated Layer): 3 (3 x Layer; 0.01 MB each; transformer.h.0, "
                           "transformer.h.1, transformer.h.2), root 0.00 MB"), line
    assert warning(user, unit_modules(user)) == ""
    big = nn.Sequential(nn.Linear(64, 512), nn.Linear(512, 2))
    assert warning(big, unit_modules(big)) == ("unit 0 holds 97% of the parameters and is gathered whole: name "
                                               "smaller modules with sync.shard_units=<classes>, or lower sync.unit_mb")


def _outside(rank: int, world_size: int) -> dict:
    env, out = DistEnv(rank, world_size, 0, torch.device("cpu"), "gloo"), {}
    cases = {"a child's bias": (ReadsAChild, "auto", lambda: torch.randn(2, 4)),
             "tied by F.linear": (lambda: UserTransformer(n_layer=2), "Embedding,Layer",
                                  lambda: {"tokens": torch.randint(0, 16, (2, 8))})}
    for name, (make, units, batch) in cases.items():
        for mode in ("zero", "fsdp"):
            torch.manual_seed(0)
            model = make()
            cfg = (sync_cfg("zero", "builtin", zero_stage=3, shard_units=units) if mode == "zero"
                   else sync_cfg("fsdp", shard_units=units))
            sync = build_sync(cfg, model, env)
            try:
                sync.module(batch()).sum().backward()
                out[name, mode] = "trained"
            except ConfigError as e:
                out[name, mode] = str(e)
            # a forward after: the check ran once and left no mode on
            out[name, mode, "after"] = torch.overrides._get_current_function_mode_stack() == []
    return out


def test_a_parameter_read_outside_its_unit_is_refused_in_one_line():
    ranks = run_in_processes(_outside, 2, timeout=120)
    for r in ranks:
        for mode in ("zero", "fsdp"):
            assert r["a child's bias", mode] == (
                "parameter a.bias is read outside the forward of its unit a (by add): a sharded unit's weights are "
                "whole only inside its own forward; call the module that holds it, or name other modules with "
                "sync.shard_units=<classes> so that a is not a unit"), (mode, r["a child's bias", mode])
            assert r["tied by F.linear", mode].startswith(
                "parameter transformer.wte.weight is read outside the forward of its unit transformer.wte (by "
                "linear)"), (mode, r["tied by F.linear", mode])
            assert r["a child's bias", mode, "after"] and r["tied by F.linear", mode, "after"]
