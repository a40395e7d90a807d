"""sync=fsdp (torch's FSDP2): the same steps as one process, 1/N of the model state per rank.

The cases of test_zero.py (LeNet under SGD with momentum and under AdamW with grad_accum=2, the
GPT with its tied embedding under AdamW, clipping), at 2 and 3 ranks, against one process on the
whole batch and against sync=flat; and the averaging bug of gloo's reduce-scatter that
fsdp.py guards against, checked where it lives.
"""
from __future__ import annotations

import hashlib

import pytest
import torch
import torch.distributed as dist
from hydra.errors import ConfigCompositionException

from ddp_lab.config import ConfigError
from ddp_lab.distributed import DistEnv
from ddp_lab.models.lenet import lenet
from ddp_lab.sync import build_sync, options_of
from tests.multiproc import run_in_processes
from tests.sync import sync_cfg
from tests.sync.test_zero import CASES, CPU, STEPS, _model, _train, references

# FSDP2 runs torch's collectives, or its reduce-scatter ours (sync.algo=direct: fsdp_direct.py); "+overlap":
# sync.overlap, its gathers started a unit ahead and (direct) its reduce-scatters left travelling, under
# accumulation, clipping and the GPT's tied root
FSDP_CASES = [c for c in CASES if c[4] in ("builtin", "direct")]
FSDP_CASES += [(f"{name}+overlap", kind, optimizer, micro, f"{algo}+overlap", clip)
               for name, kind, optimizer, micro, algo, clip in FSDP_CASES
               if (algo == "direct" and (micro > 1 or clip)) or (algo == "builtin" and kind == "gpt" and not clip)]


def _padded_rows_bytes(params, n: int) -> int:
    """What FSDP2 keeps of each parameter: ceil(rows / N) of its rows (dim 0, padded), in fp32."""
    return sum(4 * -(-p.shape[0] // n) * (p.numel() // p.shape[0]) for p in params)


def _run(rank: int, world_size: int) -> dict:
    out = {}
    env = DistEnv(rank, world_size, 0, CPU, "gloo")
    # gloo's reduce-scatter with ReduceOp.AVG summed (pytorch#162338): the rank r+1 send r+1 each
    mean = torch.empty(3)
    dist.reduce_scatter_tensor(mean, torch.full((3 * world_size,), float(rank + 1)), op=dist.ReduceOp.AVG)
    out["avg"] = mean.tolist()
    for name, kind, optimizer, micro, algo, clip in FSDP_CASES:
        mine, ref_opt, ref, flat = references(kind, optimizer, micro, clip, env)
        model = _model(kind)
        if rank > 0:  # only rank 0's initial weights may count: the sync must broadcast them
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.01 * rank)
        sync = build_sync(sync_cfg("fsdp", algo.split("+")[0], overlap="+overlap" in algo), model, env)
        held = []  # the model state after each step, its gradients still there
        opt = _train(sync, kind, optimizer, mine, clip, held)
        whole = {k: t.clone() for k, t in sync.each_weight(model)}  # (a tensor at a time, whole on every rank)
        params = [p.full_tensor().detach() for p in model.parameters()]
        named = {k: p.full_tensor().detach() for k, p in model.named_parameters()}
        out[name] = {
            "ref_diff": max((a - b).abs().max().item() for a, b in zip(params, ref)),
            "flat_diff": max((a - b).abs().max().item() for a, b in zip(params, flat)),
            "sha1": hashlib.sha1(b"".join(p.numpy().tobytes() for p in params)).hexdigest(),
            "norms": opt.norms, "ref_norms": ref_opt.norms,
            "model_state": held[-1], "kept": _padded_rows_bytes(model.parameters(), world_size),
            "local": sum(p.to_local().numel() for p in model.parameters()),
            "numel": sum(p.numel() for p in params), "wire_bytes": sync.wire_bytes,
            "collectives": sync.collectives, "units": len(sync.units),
            "describe": sync.describe(), "state_dict": sorted(whole),
            "travelling": getattr(sync.reduce_scatter, "returned_travelling", 0),
            "gathers_async": {g.unshard_async_op for m in model.modules() if hasattr(m, "_get_fsdp_state")
                              for g in m._get_fsdp_state()._fsdp_param_groups},
            "reduce_scatter": {type(g._reduce_scatter_comm).__name__ for m in model.modules()
                               if hasattr(m, "_get_fsdp_state") for g in m._get_fsdp_state()._fsdp_param_groups},
            "state_dict_equal": all(torch.equal(whole[k], v) for k, v in named.items())}
    return out


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"{n}ranks")
def results(request):
    return request.param, run_in_processes(_run, request.param, timeout=240)


def test_gloo_averages_in_its_reduce_scatter(results):
    """If this fails, pytorch#162338 is back: fsdp.py's force-sum keeps FSDP2 right, and zero sums itself."""
    n, ranks = results
    assert all(x["avg"] == [(n + 1) / 2] * 3 for x in ranks), [x["avg"] for x in ranks]


def test_every_case_takes_the_steps_of_one_process(results):
    n, ranks = results
    for name, _, optimizer, _, _, clip in FSDP_CASES:
        r = ranks[0][name]
        if clip:  # the norm over the whole model, the one process's, on every rank; and clipping engaged
            assert all(abs(a - b) < 1e-4 * b for x in ranks for a, b in zip(x[name]["norms"], r["ref_norms"]))
            assert max(r["ref_norms"]) > clip, (name, r["ref_norms"])
        assert r["ref_diff"] < (1e-5 if optimizer == "sgd" else 1e-4), (n, name, r["ref_diff"])
        assert r["flat_diff"] < (1e-6 if optimizer == "sgd" else 1e-4), (n, name, r["flat_diff"])
        assert {x[name]["sha1"] for x in ranks} == {r["sha1"]}, (n, name)  # every rank the same weights


def test_each_rank_holds_its_rows_of_the_model_state(results):
    n, ranks = results
    for name, kind, optimizer, micro, algo, _ in FSDP_CASES:
        per_element = {"sgd": 4, "adamw": 8}[optimizer]  # the momentum; AdamW's two moments (fp32)
        assert sum(x[name]["local"] for x in ranks) == ranks[0][name]["numel"], name  # the rows split N ways
        for x in ranks:
            # weights and gradients: ceil(rows / N) rows of each parameter (its storage padded); the
            # optimizer's state: this rank's rows alone
            kept, state = x[name]["kept"], per_element * x[name]["local"]
            assert kept < 4 * x[name]["numel"] // n + 4 * 64 * 16, name  # (padding: a row per parameter at most)
            assert x[name]["model_state"] == {"weights": kept, "grads": kept, "optimizer": state,
                                              "sync": 0, "total": 2 * kept + state}, name
        r = ranks[0][name]
        assert r["describe"] == f"fsdp/{algo}"
        comm = "DirectReduceScatter" if algo.startswith("direct") else "DefaultReduceScatter"
        assert r["reduce_scatter"] == {comm}, name
        # as zero stage 3 counts: each micro-batch gathers the weights in the forward and the backward (the
        # GPT's root unit, its tied embedding, once), each step reduce-scatters the gradients once
        assert r["wire_bytes"] > STEPS * (micro * 4 * r["numel"] * (0.75 if kind == "gpt" else 1)
                                          + 2 * r["numel"]) * 0.99, name
        assert r["wire_bytes"] <= STEPS * (micro * 4 * r["numel"] + 2 * r["numel"]), name
        # the calls: each unit gathered twice a micro-batch and reduce-scattered once a step; the GPT's root
        # (its tied embedding) gathered once and reduce-scattered once
        units, root = r["units"], kind == "gpt"
        assert units >= 3 and r["collectives"] == STEPS * (micro * (2 * units + root) + units + root), name
        # sync.overlap: every gather asynchronous; each reduce-scatter of a step (its units' and the root's) returned
        # with its messages under way
        assert r["gathers_async"] == {"+overlap" in algo}, name
        assert r["travelling"] == (STEPS * (units + root) if algo == "direct+overlap" else 0), name


def test_each_weight_hands_out_the_whole_state_dict(results):
    n, ranks = results
    for name, *_ in FSDP_CASES:
        assert all(x[name]["state_dict_equal"] is True for x in ranks), name
        assert all(x[name]["state_dict"] == ranks[0][name]["state_dict"] != [] for x in ranks), name


def test_what_fsdp_cannot_do_is_refused_in_one_line(compose_train):
    with pytest.raises(ConfigError, match=r"^sync.algo=ring_textbook cannot run inside torch's FSDP2 \(sync=zero runs "
                                          r"ring_textbook; direct here is the gradients' reduce-scatter\): sync=fsdp "
                                          r"takes sync.algo=builtin or direct$"):
        build_sync(sync_cfg("fsdp", "ring_textbook"), lenet(), DistEnv(0, 2, 0, CPU, "gloo"))
    # no cast of the gradients: sync=fsdp takes no sync.compress
    with pytest.raises(TypeError, match=r"^sync=fsdp takes no compress$"):
        sync_cfg("fsdp", "builtin", "bf16")
    with pytest.raises(ConfigCompositionException, match=r"Could not override 'sync.compress'"):
        compose_train(["sync=fsdp", "sync.compress=bf16"])


def test_our_reduce_scatter_stands_in_for_gloos_alone():
    from ddp_lab.sync.sharded.fsdp_direct import custom_reduce_scatter
    with pytest.raises(ConfigError, match=r"^sync=fsdp sync.algo=direct stands in for gloo's reduce-scatter \(an "
                                          r"all-reduce\); nccl has its own: leave sync.algo=builtin$"):
        custom_reduce_scatter("nccl")
    assert type(custom_reduce_scatter("gloo")).__name__ == "DirectReduceScatter"


def test_overlap_is_for_gloo_alone():
    """sync.overlap: on NCCL FSDP2 overlaps on its streams; refused in one line before any module is touched."""
    from ddp_lab.sync.sharded.fsdp import gather_ahead
    with pytest.raises(ConfigError, match=r"^sync.overlap=true overlaps FSDP2's collectives on gloo; on nccl FSDP2 "
                                          r"overlaps them on its own streams: leave sync.overlap out$"):
        gather_ahead([lenet()], "nccl")


def test_fsdp_is_not_compiled(compose_train):
    from ddp_lab.sync import eager_only
    from ddp_lab.training.builder import validate
    with pytest.raises(ConfigError, match=r"^trainer.compile=true cannot run where sync=fsdp applies "
                                          r"fully_shard .* set "
                                          r"trainer.compile=false \(or auto\)$"):
        validate(compose_train(["sync=fsdp", "trainer.compile=true"]))
    assert "fully_shard" in eager_only(options_of(compose_train(["sync=fsdp"]).sync))


def test_units_are_the_top_level_children_or_the_named_classes():
    from ddp_lab.models.gpt import Block, gpt
    from ddp_lab.sync.sharded.units import unit_modules
    model = gpt(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=16)
    blocks = [m for m in model.modules() if isinstance(m, Block)]
    assert len(blocks) == 2 and all(b in unit_modules(model) for b in blocks)  # a ModuleList's children
    assert unit_modules(model, "Block") == blocks
    with pytest.raises(ConfigError, match=r"^sync.shard_units=Layer names no module of this model: its classes "
                                          r"are .*Block.*"):
        unit_modules(model, "Layer")


def test_a_torch_without_fully_shard_is_refused_in_one_line(monkeypatch):
    import torch.distributed.fsdp

    from ddp_lab.sync.sharded.fsdp import fully_shard_or_refuse
    monkeypatch.delattr(torch.distributed.fsdp, "fully_shard")
    with pytest.raises(ConfigError, match=r"^sync=fsdp needs torch.distributed.fsdp.fully_shard \(torch >= "
                                          r"2.6\); this torch is .*: upgrade torch, or use sync=zero "
                                          r"sync.zero_stage=3$"):
        fully_shard_or_refuse()
