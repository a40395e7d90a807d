"""A user's model under every sharded mode: the same steps as DDP and as one process.

tests/sync/user_model.py's transformer (blocks nested in `transformer.h`, an output tied by F.linear,
a frozen position embedding or a frozen block, LayerNorms, dict batches) trains 3 AdamW steps with
optim.no_decay=1d (biases, norms and the frozen 1-D tensors out of weight decay) at 2 ranks, under
DDP, zero stages 1-3 and fsdp, also with every unit's activations checkpointed, and built on the meta
device; a small conv net with BatchNorm checks that the buffers follow rank 0's, as under DDP.
AdamW amplifies the other order of the float sums (test_zero.py): 1e-4.
"""
from __future__ import annotations

import dataclasses
import hashlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ddp_lab.distributed import DistEnv
from ddp_lab.models.meta_init import MetaInit, build_on_meta
from ddp_lab.sync import ReplicaSync, SyncContext, build_sync
from ddp_lab.training import activation_checkpointing
from ddp_lab.training.optim import no_decay_names
from tests.multiproc import run_in_processes
from tests.sync import sync_cfg
from tests.sync.user_model import UserTransformer

STEPS, BATCH = 3, 4
CPU = torch.device("cpu")
MODES = {"ddp": sync_cfg("ddp", bucket_cap_mb=0.1),
         "zero1": sync_cfg("zero", "builtin", zero_stage=1, bucket_cap_mb=0.005),
         "zero2": sync_cfg("zero", "builtin", zero_stage=2, bucket_cap_mb=0.005),
         "zero3": sync_cfg("zero", "builtin", zero_stage=3, bucket_cap_mb=0.1), "fsdp": sync_cfg("fsdp")}
# (frozen part, activation checkpointing, built on the meta device)
VARIANTS = {"frozen positions": ("positions", "none", False), "frozen block": ("block", "none", False),
            "checkpointed": ("positions", "units", False), "meta": ("block", "none", True)}


def bn_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.BatchNorm2d(4),
                         nn.ReLU(), nn.Flatten(), nn.Linear(64, 3))


def _batches(kind: str):
    g = torch.Generator().manual_seed(1)
    if kind == "bn":
        return torch.randn(STEPS, BATCH, 1, 8, 8, generator=g), torch.randint(0, 3, (STEPS, BATCH), generator=g)
    tokens = torch.randint(0, 16, (STEPS, BATCH, 9), generator=g)
    return tokens[..., :-1], tokens[..., 1:]


def _loss(kind, out, y):
    return F.cross_entropy(out, y) if kind == "bn" else F.cross_entropy(out.flatten(0, 1), y.flatten())


def _train(sync, kind: str, batches, bf16: bool = False) -> None:
    # (eps 1e-4: a key bias's gradient is 0 but for rounding, which a smaller eps would blow up to the lr)
    opt = torch.optim.AdamW(sync.param_groups(), lr=1e-2, weight_decay=0.1, eps=1e-4)
    for step, (x, y) in enumerate(batches, 1):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = _loss(kind, sync.module(x if kind == "bn" else {"tokens": x}), y)
        loss.backward()
        sync.after_backward()
        opt.step()
        opt.zero_grad(set_to_none=sync.caps.grads_set_to_none)
        sync.after_step(step)


def _build(kind: str, frozen: str, meta: bool):
    torch.manual_seed(0)
    make = bn_net if kind == "bn" else (lambda: UserTransformer(n_layer=3, frozen=frozen))
    if not meta:
        return make(), None
    model, why = build_on_meta(make)
    assert why == ""
    return model, MetaInit(model)


def _state(sync, model) -> dict:
    """The model's whole state_dict (each_weight: gathered a unit at a time), and its digest."""
    state = {k: v.detach().contiguous().clone().numpy() for k, v in sync.each_weight(model)}  # (numpy: pickled)
    digest = hashlib.sha1(b"".join(v.tobytes() for v in state.values())).hexdigest()
    return {"state": state, "sha1": digest}


def _run(rank: int, world_size: int) -> dict:
    env, out = DistEnv(rank, world_size, 0, CPU, "gloo"), {}
    per = BATCH // world_size
    cases = [(v, "user", *VARIANTS[v]) for v in VARIANTS] + [("batchnorm", "bn", "none", "none", False)]
    for variant, kind, frozen, ac, meta in cases:
        x, y = _batches(kind)
        mine = [(x[s, rank * per:(rank + 1) * per], y[s, rank * per:(rank + 1) * per]) for s in range(STEPS)]
        model, _ = _build(kind, frozen, False)
        initial = {k: v.clone().numpy() for k, v in model.state_dict().items()}
        if kind == "user":  # one process on the whole global batches
            sync = ReplicaSync(model, DistEnv(0, 1, 0, CPU, "none"))
            sync.no_decay = no_decay_names(model, "1d")
            _train(sync, kind, [(x[s], y[s]) for s in range(STEPS)])
            out[variant, "one"] = _state(sync, model)
        for mode, cfg in MODES.items():
            if meta and mode not in ("zero3", "fsdp"):
                continue
            model, init = _build(kind, frozen, meta)
            no_decay = no_decay_names(model, "1d")
            activation_checkpointing.apply(model, ac)
            sync = build_sync(cfg, model, env, SyncContext(init=init, no_decay=no_decay))
            _train(sync, kind, mine)
            out[variant, mode] = {**_state(sync, model), "initial": initial,
                                  "groups": [len(g["params"]) for g in sync.param_groups()],
                                  "decay0": [g.get("weight_decay") for g in sync.param_groups()],
                                  "frozen_pieces": [u.piece.numel() for u in getattr(sync, "frozen_units", [])],
                                  "frozen_local": {n: (p.to_local().shape[0] if hasattr(p, "to_local") else None)
                                                   for n, p in model.named_parameters() if not p.requires_grad}}
    # trainer.amp=bf16: one process with fp32 weights under autocast, against stage 3 and fsdp gathering bf16
    # weights (their gradients reduce-scattered in fp32, or bf16), the optimizer stepping fp32 shards
    x, y = _batches("user")
    mine = [(x[s, rank * per:(rank + 1) * per], y[s, rank * per:(rank + 1) * per]) for s in range(STEPS)]
    model, _ = _build("user", "positions", False)
    initial = {k: v.clone().numpy() for k, v in model.state_dict().items()}
    sync = ReplicaSync(model, DistEnv(0, 1, 0, CPU, "none"))
    _train(sync, "user", [(x[s], y[s]) for s in range(STEPS)], bf16=True)
    out["bf16", "one"] = {**_state(sync, model), "initial": initial}
    for mode in ("zero3", "fsdp"):
        for reduce in ("fp32", "bf16"):
            for weights in (None, torch.bfloat16):
                model, _ = _build("user", "positions", False)
                cfg = dataclasses.replace(MODES[mode], reduce_dtype=reduce)
                sync = build_sync(cfg, model, env, SyncContext(no_decay=no_decay_names(model, "1d"),
                                                               param_dtype=weights))
                _train(sync, "user", mine, bf16=True)
                dtypes = sorted({str(p.dtype) for p in model.parameters()})
                out["bf16", mode, reduce, str(weights)] = {**_state(sync, model), "wire_bytes": sync.wire_bytes,
                                                            "dtypes": dtypes}
    return out


@pytest.fixture(scope="module")
def ranks():
    return run_in_processes(_run, 2, timeout=300)


def _off(a: dict, ref: dict) -> float:
    """How far a's weights are from ref's, over how far ref's moved from the initial weights (L2, all tensors)."""
    off = sum(float(((a[k].astype("float64") - ref["state"][k]) ** 2).sum()) for k in a)
    moved = sum(float(((ref["state"][k].astype("float64") - ref["initial"][k]) ** 2).sum()) for k in a)
    return (off / moved) ** 0.5


def _diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float(abs(a[k].astype("float64") - b[k].astype("float64")).max()) for k in a)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_sharded_mode_takes_ddps_and_one_process_steps(ranks, variant):
    r = ranks[0]
    for mode in MODES:
        if (variant, mode) not in r:
            continue
        got = r[variant, mode]
        assert {x[variant, mode]["sha1"] for x in ranks} == {got["sha1"]}, mode  # every rank the same
        assert _diff(got["state"], r[variant, "ddp" if variant != "meta" else "zero3"]["state"]) < 1e-4, mode
        assert _diff(got["state"], r[variant, "one"]["state"]) < 1e-4, mode
        for name, value in got["state"].items():  # frozen weights unchanged, trained ones moved
            frozen = ("wpe" in name) if VARIANTS[variant][0] == "positions" else name.startswith("transformer.h.0.")
            assert (value == got["initial"][name]).all() == frozen, (mode, name)


def test_built_on_meta_equals_built_whole(ranks):
    """The meta build (units made one at a time, frozen ones too) trains to the bits of the whole build."""
    r = ranks[0]
    for mode in ("zero3", "fsdp"):
        assert r["meta", mode]["sha1"] == r["frozen block", mode]["sha1"], mode


def test_frozen_weights_are_sharded_and_out_of_the_optimizer(ranks):
    r = ranks[0]
    block = sum(v.size for k, v in r["frozen block", "ddp"]["state"].items() if k.startswith("transformer.h.0."))
    # stage 3: the frozen block is a unit of its own kind, each rank holding half of it
    assert r["frozen block", "zero3"]["frozen_pieces"] == [-(-block // 2)]
    assert r["frozen positions", "zero3"]["frozen_pieces"] == [8 * 16 // 2]  # the root's frozen embedding
    # fsdp: the frozen tensors are DTensors, each rank holding half of their rows
    assert r["frozen positions", "fsdp"]["frozen_local"] == {"transformer.wpe.weight": 4}
    # no_decay=1d: two groups, the second with weight_decay 0; frozen parameters in neither
    for mode in MODES:
        assert r["frozen positions", mode]["decay0"] == [None, 0.0], mode
    assert r["frozen positions", "ddp"]["groups"] == [1 + 3 * 4, 3 * 8 + 2]  # wte, 4 matrices a block | 1-D
    assert r["frozen positions", "zero3"]["groups"][1] >= 1


def test_batchnorm_buffers_follow_rank_zeros_as_under_ddp(ranks):
    """Each step starts from rank 0's running statistics, which that step's forward moves on each rank
    by its own batch: every rank's buffers equal DDP's same rank's, and the weights every rank's."""
    for x in ranks:
        for mode in MODES:
            got = x["batchnorm", mode]
            assert _diff(got["state"], x["batchnorm", "ddp"]["state"]) < 1e-4, mode
            assert not (got["state"]["1.running_mean"] == got["initial"]["1.running_mean"]).all(), mode
            assert all((got["state"][k] == ranks[0]["batchnorm", mode]["state"][k]).all()
                       for k in got["state"] if "running" not in k and "batches" not in k), mode


def test_bf16_weights_with_fp32_master_train_as_one_process_and_halve_the_gathers(ranks):
    """Off from one process under autocast by 2% of its update with fp32 weights gathered (autocast's own
    rounding, the per-rank batches summed in another order), 4% with bf16 ones (measured at 2 ranks)."""
    r = ranks[0]
    for mode in ("zero3", "fsdp"):
        fp32 = r["bf16", mode, "fp32", "None"]  # fp32 weights gathered, under autocast: the control
        half = r["bf16", mode, "fp32", "torch.bfloat16"]
        both = r["bf16", mode, "bf16", "torch.bfloat16"]
        assert _off(fp32["state"], r["bf16", "one"]) < 0.05, mode
        for got in (half, both):
            assert _off(got["state"], r["bf16", "one"]) < 0.1, (mode, _off(got["state"], r["bf16", "one"]))
            # model.pt's weights: the fp32 master, not rounded to bf16 (the weights the forward saw)
            master = torch.cat([torch.from_numpy(v).flatten() for v in got["state"].values()])
            assert master.dtype == torch.float32 and (master.bfloat16().float() != master).any(), mode
            assert [x for x in ranks if x["bf16", mode, "fp32", "torch.bfloat16"]["sha1"] != half["sha1"]] == []
        # stage 3's parameters are views of the bf16 gathers; fsdp's, between steps, its fp32 shards
        assert half["dtypes"] == ["torch.bfloat16" if mode == "zero3" else "torch.float32"], mode
        # the weights gathered in bf16 (half the bytes); with bf16 gradients too, half of everything
        assert both["wire_bytes"] * 2 == fp32["wire_bytes"], (mode, both["wire_bytes"], fp32["wire_bytes"])
        assert both["wire_bytes"] < half["wire_bytes"] < fp32["wire_bytes"], mode
