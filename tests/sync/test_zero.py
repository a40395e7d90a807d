"""sync=zero (ZeRO stages 1 and 2): the same steps as one process, the optimizer state
(and under stage 2 the gradients) split N ways.

Every case trains a few steps at 2 and 3 ranks against one process on the whole global batch
and against sync=flat (the all-reduce every other strategy is tested equal to one process
with): LeNet under SGD with momentum and weight decay and under AdamW, with grad_accum=2, and
the small GPT (tied embedding) under AdamW; each with torch's collectives and with our ring (and with
our direct ones where a case accumulates or clips).
AdamW divides by the root of its second moment, so where a gradient is near zero the float
sums of N ranks (in another order than one process's) move a weight further than under SGD:
1e-5 from one process under SGD, 1e-4 under AdamW, and 1e-6 from flat (but clipped under AdamW).
"""
from __future__ import annotations

import contextlib
import hashlib

import pytest
import torch
import torch.nn.functional as F
from hydra.errors import ConfigCompositionException

from ddp_lab.config import ConfigError
from ddp_lab.distributed import DistEnv
from ddp_lab.models.gpt import gpt
from ddp_lab.models.lenet import lenet
from ddp_lab.sync import ReplicaSync, build_sync, check, options_of
from ddp_lab.telemetry.memory import model_state_bytes
from ddp_lab.training.tasks import LANGUAGE_MODEL
from tests.multiproc import run_in_processes
from tests.sync import sync_cfg

STEPS, BATCH = 3, 12
STAGES = (1, 2, 3)
CPU = torch.device("cpu")
SINGLE = DistEnv(0, 1, 0, CPU, "none")
GPT_ARGS = dict(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=16)
OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-3),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
}
# (name, model, optimizer, micro-batches per step, algo, gradient norm clipped to (0: not))
CASES = [(f"{m}/{o}/accum{k}/{a}" + (f"/clip{c}" if c else ""), m, o, k, a, c)
         for m, o, k, c in (("lenet", "sgd", 1, 0), ("lenet", "adamw", 2, 0), ("gpt", "adamw", 1, 0),
                            ("lenet", "sgd", 1, 0.5), ("gpt", "adamw", 1, 0.5))
         for a in ("builtin", "ring_textbook", "direct")
         # direct where it waits on more than one backward (accum) or on a clip; clipping reads the chunks alike
         # whichever algorithm reduced them, so ring_textbook is not clipped again
         if (a != "direct" or (k, c) != (1, 0)) and (a != "ring_textbook" or not c)]


def zero_cfg(algo="builtin", stage=1, **extra):
    """sync=zero's options; 0.1 MB buckets split LeNet's 0.5 MB of gradients into several."""
    return sync_cfg("zero", algo, zero_stage=stage, **{"bucket_cap_mb": 0.1, **extra})


def _model(kind: str):
    torch.manual_seed(0)
    return lenet() if kind == "lenet" else gpt(**GPT_ARGS)


def _data(kind: str, micro: int):
    g = torch.Generator().manual_seed(micro)
    if kind == "lenet":
        return (torch.randn(STEPS, micro, BATCH, 1, 28, 28, generator=g),
                torch.randint(0, 10, (STEPS, micro, BATCH), generator=g))
    tokens = torch.randint(0, 16, (STEPS, micro, BATCH, 9), generator=g)
    return tokens[..., :-1], tokens[..., 1:]


def _train(sync, kind: str, optimizer: str, steps, clip: float = 0.0, held: list | None = None):
    """The trainer's step: backward per micro-batch, sync, clipping, optimizer step on what the sync says,
    after_step. `held`: the model state bytes after each optimizer step, its gradients still there."""
    opt = OPTIMIZERS[optimizer](sync.parameters())
    opt.norms = norms = []  # the norms before clipping, step by step
    loss_fn = F.cross_entropy if kind == "lenet" else LANGUAGE_MODEL.loss
    for step, micro in enumerate(steps, 1):
        for i, (x, y) in enumerate(micro):
            with contextlib.nullcontext() if i == len(micro) - 1 else sync.no_sync():
                (loss_fn(sync.module(x), y) / len(micro)).backward()
        sync.after_backward()
        if clip:
            norms.append(sync.clip_grad_norm(clip).item())
        opt.step()
        if held is not None:
            held.append(model_state_bytes(sync.model, opt))
        opt.zero_grad(set_to_none=sync.caps.grads_set_to_none)
        sync.after_step(step)
    return opt


def _state_bytes(opt: torch.optim.Optimizer) -> int:
    return sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
               if isinstance(t, torch.Tensor) and t.dim() > 0)


def references(kind: str, optimizer: str, micro: int, clip: float, env: DistEnv):
    """(this rank's micro-batches, one process's optimizer, its weights, sync=flat's weights) of a case."""
    rank, world_size = env.rank, env.world_size
    x, y = _data(kind, micro)
    per = BATCH // world_size
    mine = [[(x[s, m, rank * per:(rank + 1) * per], y[s, m, rank * per:(rank + 1) * per])
             for m in range(micro)] for s in range(STEPS)]
    model = _model(kind)
    ref_opt = _train(ReplicaSync(model, SINGLE), kind, optimizer,
                     [[(x[s].flatten(0, 1), y[s].flatten(0, 1))] for s in range(STEPS)], clip)
    ref = [p.detach().clone() for p in model.parameters()]
    model = _model(kind)
    _train(build_sync(sync_cfg("flat", "builtin", buffer_mb=0), model, env), kind, optimizer, mine, clip)
    return mine, ref_opt, ref, [p.detach().clone() for p in model.parameters()]


def _run(rank: int, world_size: int) -> dict:
    out = {}
    env, n = DistEnv(rank, world_size, 0, CPU, "gloo"), world_size
    for name, kind, optimizer, micro, algo, clip in CASES:
        mine, ref_opt, ref, flat = references(kind, optimizer, micro, clip, env)
        for stage in STAGES:
            model = _model(kind)
            if rank > 0:  # only rank 0's initial weights may count: the sync must broadcast them
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(0.01 * rank)
            # stage 2: small buckets, so that a model spans several and they finish in the backward
            sync = build_sync(zero_cfg(algo, stage, bucket_cap_mb=0.05), model, env)
            held = []  # the model state after each step, its gradients still there
            opt = _train(sync, kind, optimizer, mine, clip, held)
            sent, calls = sync.wire_bytes, sync.collectives  # (before the gather below)
            with sync.whole_weights():  # (stage 3: gathered; the others hold them)
                params = [p.detach().contiguous().clone() for p in model.parameters()]
            out[name, stage] = {
                "ref_diff": max((a - b).abs().max().item() for a, b in zip(params, ref)),
                "flat_diff": max((a - b).abs().max().item() for a, b in zip(params, flat)),
                "sha1": hashlib.sha1(b"".join(p.numpy().tobytes() for p in params)).hexdigest(),
                "state_bytes": _state_bytes(opt), "ref_state_bytes": _state_bytes(ref_opt),
                "shard": sync.shard_size, "numel": sum(p.numel() for p in params),
                "padded": n * sync.shard_size if stage == 3 else sync.weights.numel(),
                "buckets": len(getattr(sync, "buckets", [0])),
                "root": getattr(getattr(sync, "root", None), "nbytes", 0),
                "wire_bytes": sent, "wire_after_gather": sync.wire_bytes,
                "collectives": calls, "collectives_after_gather": sync.collectives,
                "describe": sync.describe(), "model_state": held[-1],
                "grads_between_steps": model_state_bytes(model, opt)["grads"],
                "grads_left": sum(p.grad is not None for p in model.parameters()),
                "norms": opt.norms, "ref_norms": ref_opt.norms}
    for stage in STAGES:  # fewer parameters (2) than ranks at 3: every rank's shard padded, one empty
        x, y = torch.randn(STEPS, BATCH, 1, generator=torch.Generator().manual_seed(1)), torch.zeros(STEPS, BATCH, 1)
        torch.manual_seed(0)
        one = torch.nn.Linear(1, 1)
        many = torch.nn.Linear(1, 1)
        many.load_state_dict(one.state_dict())
        per = BATCH // world_size
        for sync, batches in ((ReplicaSync(one, SINGLE), [(x[s], y[s]) for s in range(STEPS)]),
                              (build_sync(zero_cfg("builtin", stage), many, env),
                               [(x[s, rank * per:(rank + 1) * per], y[s, rank * per:(rank + 1) * per])
                                for s in range(STEPS)])):
            opt = torch.optim.SGD(sync.parameters(), lr=0.1, momentum=0.9)
            for step, (xs, ys) in enumerate(batches, 1):
                F.mse_loss(sync.module(xs), ys).backward()
                sync.after_backward()
                opt.step()
                opt.zero_grad(set_to_none=sync.caps.grads_set_to_none)
                sync.after_step(step)
        with sync.whole_weights():
            out["tiny", stage] = max((a - b).abs().max().item() for a, b in zip(many.parameters(), one.parameters()))
    return out


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"{n}ranks")
def results(request):
    return request.param, run_in_processes(_run, request.param, timeout=240)


@pytest.mark.parametrize("stage", STAGES)
def test_every_case_takes_the_steps_of_one_process(results, stage):
    n, ranks = results
    for name, _, optimizer, _, _, clip in CASES:
        r, name = ranks[0][name, stage], (name, stage)
        if clip:  # the norm over the whole model, the one process's, on every rank; and clipping engaged
            assert all(abs(a - b) < 1e-4 * b for x in ranks for a, b in zip(x[name]["norms"], r["ref_norms"]))
            assert max(r["ref_norms"]) > clip, (name, r["ref_norms"])
        assert r["ref_diff"] < (1e-5 if optimizer == "sgd" else 1e-4), (n, name, r["ref_diff"])
        # (every stage lays its buffers out in reverse, padded per bucket or unit, so at 3 ranks gloo sums an
        # element in another rank order than flat's; direct sums in rank order, gloo not; clipped, the norm
        # summed over shards scales by a hair's other factor: AdamW amplifies all as the sums' order)
        apart = optimizer == "adamw"
        assert r["flat_diff"] < (1e-4 if apart else 1e-6), (n, name, r["flat_diff"])
        assert {x[name]["sha1"] for x in ranks} == {r["sha1"]}, (n, name)  # every rank the same weights


def test_each_rank_holds_one_nth_of_the_optimizer_state(results):
    n, ranks = results
    for name, kind, optimizer, _, algo, _ in CASES:
        r, name = ranks[0][name, 1], (name, 1)
        assert r["padded"] == n * r["shard"] >= r["numel"]  # stage 2's buckets, each in N equal chunks
        per_element = {"sgd": 4, "adamw": 8}[optimizer]  # the momentum; AdamW's two moments (fp32)
        assert r["ref_state_bytes"] == per_element * r["numel"], name
        for x in ranks:
            assert x[name]["state_bytes"] == per_element * r["shard"], name
        assert r["describe"] == f"zero1/{algo}"
        assert r["wire_bytes"] == 4 * r["shard"] * n * STEPS, name  # one all-reduce's worth a step, accumulating or not
        for x in ranks:
            assert x[name]["grads_left"] == r["grads_left"] == len(list(_model(kind).parameters())), name  # whole
        # ZeRO stage 1 in fp32: the whole (padded) weights and gradients, 1/N of the optimizer state
        whole = 4 * r["shard"] * n
        assert r["model_state"] == {"weights": whole, "grads": whole, "optimizer": per_element * r["shard"],
                                    "sync": 0, "total": 2 * whole + per_element * r["shard"]}, name
        assert r["grads_between_steps"] == whole, name  # kept: the backward accumulates into the buffer


def test_stage_two_holds_one_nth_of_the_gradients_too(results):
    n, ranks = results
    for name, kind, optimizer, micro, algo, _ in CASES:
        r, name = ranks[0][name, 2], (name, 2)
        per_element = {"sgd": 4, "adamw": 8}[optimizer]
        assert r["padded"] == n * r["shard"] >= r["numel"]  # every bucket in N equal chunks
        assert r["buckets"] > 1 or kind == "gpt", name  # (LeNet spans several 50 KB buckets)
        for x in ranks:
            assert x[name]["state_bytes"] == per_element * r["shard"], name
            assert x[name]["grads_left"] == 0, name  # no parameter keeps a whole gradient
        assert r["describe"] == f"zero2/{algo}"
        # a reduce-scatter per micro-batch (half an all-reduce's bytes) and one all-gather a step
        assert r["wire_bytes"] == STEPS * (micro + 1) * 4 * r["padded"] // 2, name
        assert r["collectives"] == STEPS * (micro + 1) * r["buckets"], name  # one call a bucket, each way
        # ZeRO stage 2 in fp32: the whole (padded) weights, 1/N of the gradients and of the optimizer state
        whole, mine = 4 * r["padded"], 4 * r["shard"]
        assert r["model_state"] == {"weights": whole, "grads": mine, "optimizer": per_element * r["shard"],
                                    "sync": 0, "total": whole + mine + per_element * r["shard"]}, name
        assert r["grads_between_steps"] == 0, name  # made as each bucket lands, dropped after the step


def test_stage_three_holds_one_nth_of_everything(results):
    n, ranks = results
    for name, kind, optimizer, micro, algo, _ in CASES:
        r, name = ranks[0][name, 3], (name, 3)
        per_element = {"sgd": 4, "adamw": 8}[optimizer]
        # units: LeNet's 4 layers; the GPT's embedding of positions, block, final norm, and the root
        # (its token embedding, tied to the output layer)
        assert r["buckets"] == 4 and (r["root"] > 0) == (kind == "gpt"), (name, r["buckets"], r["root"])
        for x in ranks:
            assert x[name]["grads_left"] == 0, name
            assert x[name]["model_state"] == {"weights": 4 * r["shard"], "grads": 4 * r["shard"],
                                              "optimizer": per_element * r["shard"], "sync": 0,
                                              "total": (8 + per_element) * r["shard"]}, name
            assert x[name]["grads_between_steps"] == 0, name
        assert r["describe"] == f"zero3/{algo}"
        # each micro-batch: every unit gathered in the forward, all but the root again in the backward,
        # and reduce-scattered; each half an all-reduce's bytes: 1.5 all-reduces when there is no root
        whole = 4 * r["padded"]
        assert r["wire_bytes"] == STEPS * micro * (3 * whole - r["root"]) // 2, name
        assert r["wire_after_gather"] == r["wire_bytes"], name  # whole_weights' gather is no training step's
        assert r["collectives_after_gather"] == r["collectives"], name
        # a unit's gather in the forward, again in the backward (not the root's), its reduce-scatter
        units = r["buckets"]
        assert r["collectives"] == STEPS * micro * (3 * units - (r["root"] > 0)), (name, r["collectives"])


def test_a_model_with_fewer_parameters_than_ranks_trains_as_one_process(results):
    n, ranks = results
    for stage in STAGES:
        assert all(x["tiny", stage] < 1e-6 for x in ranks), (n, stage, [x["tiny", stage] for x in ranks])


def test_parameters_of_two_dtypes_are_refused_in_one_line():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).half())
    for stage in STAGES:
        with pytest.raises(ConfigError, match=r"^sync=zero needs every trainable parameter of one "
                                              r"floating-point dtype and device; this model has \['torch.float16', "
                                              r"'torch.float32'\]: use sync=flat$"):
            build_sync(zero_cfg(stage=stage), model, DistEnv(0, 2, 0, CPU, "gloo"))


def test_what_zero_cannot_do_is_refused_in_one_line(compose_train):
    with pytest.raises(ConfigError, match=r"^sync.algo=ring has no reduce-scatter and all-gather of its own: sync=zero "
                                          r"takes sync.algo=builtin or ring_textbook or direct$"):
        build_sync(zero_cfg(algo="ring"), lenet(), DistEnv(0, 2, 0, CPU, "gloo"))
    # no cast of the gradients: sync=zero takes no sync.compress
    with pytest.raises(TypeError, match=r"^sync=zero takes no compress$"):
        zero_cfg(compress="bf16")
    with pytest.raises(ConfigCompositionException, match=r"Could not override 'sync.compress'"):
        compose_train(["sync=zero", "sync.compress=bf16"])


def test_stage_three_is_not_compiled(compose_train):
    from ddp_lab.sync import eager_only
    from ddp_lab.training.builder import validate
    from ddp_lab.training.fast_path import resolve_compile
    with pytest.raises(ConfigError, match=r"^trainer.compile=true cannot run where sync.zero_stage=3 gathers and frees "
                                          r"the weights in module hooks .*: set trainer.compile=false \(or auto\)$"):
        validate(compose_train(["sync=zero", "sync.zero_stage=3", "trainer.compile=true"]))
    cfg = compose_train(["sync=zero", "sync.zero_stage=3"])
    validate(cfg)  # auto: turned off, with the reason in the log
    assert resolve_compile("auto", CPU, 10**9, eager_only(options_of(cfg.sync))) == (
        False, "trainer.compile=auto: off, sync.zero_stage=3 gathers and frees the weights in module hooks that "
               "resize their storage")
    assert eager_only(options_of(compose_train(["sync=zero", "sync.zero_stage=2"]).sync)) == ""


def test_the_schema_takes_stages_one_to_three(compose_train):
    check(options_of(compose_train(["sync=zero", "sync.zero_stage=3"]).sync))
    with pytest.raises(ConfigError, match=r"^sync.zero_stage=4 must be 1, 2 or 3$"):
        check(options_of(compose_train(["sync=zero", "sync.zero_stage=4"]).sync))


FREE_AND_MEASURE = """
import os, sys, torch
from ddp_lab.distributed.host_malloc import for_sharded
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
print(for_sharded(torch.device("cpu")) if sys.argv[1] == "set" else None)
big = torch.ones(6 * 2**20)  # 24 MiB, mmapped and given back: glibc's threshold grows to 24 MiB
del big
before = rss()
mid = torch.ones(4 * 2**20)  # 16 MiB: below the grown threshold, from the heap, which keeps it when freed
del mid
print(rss() - before)
"""


@pytest.mark.parametrize("how", ["set", "default"])
def test_stage_three_has_freed_blocks_given_back_to_the_kernel(how):
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", FREE_AND_MEASURE, how], capture_output=True, text=True, env=env,
                         check=True).stdout.split()
    kept = int(out[1])
    if how == "set":
        assert out[0] == "True" and kept < 4 * 2**20, out  # the 16 MiB went back
    else:
        assert kept > 15 * 2**20, out  # glibc's default: kept in the heap (what the setting is for)
