"""sync.islands: the groups, and the proofs that islands are what they claim.

* 1 island of N ranks, DiLoCo at outer lr 1 without momentum: DDP over the N ranks;
* N islands of 1: today's per-rank DiLoCo;
* 2 islands of 2 (DDP, flat, ZeRO stage 2 or 3 or FSDP2 inside, DiLoCo across): a reference written out here, 2 workers
  each stepping AdamW on the mean gradient of its two ranks' batches, and DiLoCo's outer Nesterov step on the
  workers' mean change (the update of tests/sync/test_diloco.py's reference);
and what crosses between islands: each rank's half of the outer gradient, the island gathering the halves.
HSDP (sync=fsdp with islands): DDP's steps, each rank's half of the gradients crossing.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ddp_lab.config import ConfigError
from ddp_lab.distributed import DistEnv
from ddp_lab.sync import build_sync, check, options_of
from ddp_lab.sync.islands.layout import build_islands, island_size
from tests.multiproc import run_in_processes
from tests.sync import sync_cfg

CPU = torch.device("cpu")
H, ROUNDS, LR, MU, BATCH = 3, 3, 0.7, 0.9, 4
INNER = {"ddp": {"inner": "ddp"}, "flat": {"inner": "flat"}, "zero2": {"inner": "zero", "inner_zero_stage": 2},
         "zero3": {"inner": "zero", "inner_zero_stage": 3}, "fsdp": {"inner": "fsdp"}}  # inside 2 islands of 2
DILOCO = {"every": H, "outer_lr": LR, "outer_momentum": MU}  # sync=diloco's keys in every run of it


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def _data(world_size: int):
    g = torch.Generator().manual_seed(5)
    return (torch.randn(H * ROUNDS, world_size, BATCH, 6, generator=g),
            torch.randint(0, 3, (H * ROUNDS, world_size, BATCH), generator=g))


def _layouts(rank: int, world_size: int, specs: list[str]) -> list[dict]:
    """Each layout's groups as this rank sees them (every rank builds them all, in the same order)."""
    out = []
    for spec in specs:
        isl = build_islands(spec, DistEnv(rank, world_size, 0, CPU, "gloo"))
        out.append({"inside": dist.get_process_group_ranks(isl.inside.group),
                    "across": dist.get_process_group_ranks(isl.across.group),
                    "at": (isl.index, isl.member, isl.inside.rank, isl.inside.world_size, isl.across.rank,
                           isl.across.world_size)})
    return out


LAYOUTS = {"2": ([[0, 1], [0, 1], [2, 3], [2, 3]], [[0, 2], [1, 3], [0, 2], [1, 3]]),
           "1": ([[0], [1], [2], [3]], [[0, 1, 2, 3]] * 4),
           "4": ([[0, 1, 2, 3]] * 4, [[0], [1], [2], [3]])}


def test_four_ranks_make_the_islands_and_the_groups_across_them():
    """2x2, 4x1 and 1x4: the ranks inside each island and across them, and each rank's place in both."""
    ranks = run_in_processes(_layouts, 4, list(LAYOUTS), timeout=120)
    for i, (spec, (inside, across)) in enumerate(LAYOUTS.items()):
        got = [r[i] for r in ranks]
        assert [g["inside"] for g in got] == inside and [g["across"] for g in got] == across, spec
        k = len(inside[0])
        assert [g["at"] for g in got] == [(r // k, r % k, r % k, k, r // k, 4 // k) for r in range(4)], spec


def _train(rank: int, world_size: int, over: dict, inner_opt: str = "adamw") -> dict:
    x, y = _data(world_size)
    env = DistEnv(rank, world_size, 0, CPU, "gloo")
    model = _model()
    sync = build_sync(sync_cfg(**{**(DILOCO if over["mode"] == "diloco" else {}), **over}), model, env)
    opt = (torch.optim.AdamW(sync.param_groups(), lr=1e-2, weight_decay=0.1) if inner_opt == "adamw"
           else torch.optim.SGD(sync.param_groups(), lr=0.1))  # (sync/inner=zero: this rank's chunks)
    steps = []
    for step in range(H * ROUNDS):
        F.cross_entropy(sync.module(x[step, rank]), y[step, rank]).backward()
        sync.after_backward()
        opt.step()
        opt.zero_grad(set_to_none=sync.caps.grads_set_to_none)
        sync.after_step(step + 1)
        with sync.whole_weights():  # (zero stage 3 inside: gathered)
            steps.append([_whole(p).clone().numpy() for p in model.parameters()])  # (numpy pins storage)
    return {"steps": steps, "describe": sync.describe(), **sync.counts()}


def _train_each(rank: int, world_size: int, runs: dict) -> dict:
    """_train of each of `runs` ({name: (over, inner_opt)}) in turn, in one launch of the ranks (a launch imports
    torch in every rank: seconds)."""
    return {name: _train(rank, world_size, over, opt) for name, (over, opt) in runs.items()}


def _by_name(ranks: list[dict]) -> dict:
    """{name: [rank 0's result, rank 1's, ...]} from _train_each's ranks."""
    return {name: [r[name] for r in ranks] for name in ranks[0]}


def _whole(p: torch.Tensor) -> torch.Tensor:
    """A parameter whole (HSDP's DTensors gathered)."""
    return (p.full_tensor() if hasattr(p, "full_tensor") else p).detach()


def _apart(a: dict, b: dict) -> float:
    return max(float(abs(torch.from_numpy(u) - torch.from_numpy(v)).max())
               for s, t in zip(a["steps"], b["steps"]) for u, v in zip(s, t))


@pytest.fixture(scope="module")
def runs():
    """The 4-rank runs the proofs compare, in one launch: DDP (SGD), one island of 4, HSDP; 4 islands of 1 and
    per-rank DiLoCo; 2 islands of 2 with each inner strategy (INNER's names)."""
    sgd = {"DDP": {"mode": "ddp"}, "one island": {"mode": "diloco", "islands": "4", "outer_lr": 1.0,
                                                  "outer_momentum": 0.0},
           "hsdp": {"mode": "fsdp", "islands": "2"}, "hsdp direct": {"mode": "fsdp", "islands": "2", "algo": "direct"},
           "hsdp direct overlap": {"mode": "fsdp", "islands": "2", "algo": "direct", "overlap": True}}
    adamw = {"4 islands": {"mode": "diloco", "islands": "1"}, "per rank": {"mode": "diloco"},
             **{inner: {"mode": "diloco", "islands": "2", **over} for inner, over in INNER.items()}}
    return _by_name(run_in_processes(_train_each, 4, {**{k: (v, "sgd") for k, v in sgd.items()},
                                                      **{k: (v, "adamw") for k, v in adamw.items()}}, timeout=300))


def test_one_island_of_four_ranks_is_ddp(runs):
    """Inside: DDP every step; across: DiLoCo over one island, lr 1 and no momentum, which leaves the weights."""
    islands, ddp = runs["one island"], runs["DDP"]
    for r in range(4):
        assert _apart(islands[r], ddp[r]) < 1e-6
    assert islands[0]["describe"].startswith("islands(1 islands of 4: ddp/builtin inside, diloco/builtin(every 3")
    assert islands[0]["wire_bytes_across"] > 0  # (a group of one: counted, never sent)


def test_four_islands_of_one_rank_are_per_rank_diloco(runs):
    islands, per_rank = runs["4 islands"], runs["per rank"]
    for r in range(4):
        assert _apart(islands[r], per_rank[r]) < 1e-6
    assert _apart(islands[0], islands[1]) > 1e-3  # every rank its own island


def reference() -> list[list[list[torch.Tensor]]]:
    """Each island's parameters after every step: 2 workers, worker w stepping on ranks 2w and 2w+1's batches."""
    x, y = _data(4)
    workers = [_model() for _ in range(2)]
    opts = [torch.optim.AdamW(w.parameters(), lr=1e-2, weight_decay=0.1) for w in workers]
    anchor = [p.detach().clone() for p in workers[0].parameters()]
    buf = [torch.zeros_like(a) for a in anchor]
    seen = [[], []]
    for step in range(H * ROUNDS):
        for w, (model, opt) in enumerate(zip(workers, opts)):
            loss = sum(F.cross_entropy(model(x[step, r]), y[step, r]) for r in (2 * w, 2 * w + 1)) / 2
            loss.backward()
            opt.step()
            opt.zero_grad()
        if (step + 1) % H == 0:
            with torch.no_grad():
                for i, a in enumerate(anchor):
                    delta = sum(a - list(m.parameters())[i] for m in workers) / 2
                    buf[i] = MU * buf[i] + delta
                    a -= LR * (delta + MU * buf[i])
                    for m in workers:
                        list(m.parameters())[i].copy_(a)
        for w, m in enumerate(workers):
            seen[w].append([p.detach().clone() for p in m.parameters()])
    return seen


@pytest.mark.parametrize("inner", list(INNER))
def test_two_islands_of_two_take_the_steps_of_their_reference(runs, inner):
    """(zero inside: each island's optimizer state and gradients sharded over its 2 ranks, stage 3 and fsdp its
    weights too, each rank's outer gradient then of its own shard: the same steps.)"""
    ranks = runs[inner]
    ref = reference()
    for r, got in enumerate(ranks):
        for step, (mine, want) in enumerate(zip(got["steps"], ref[r // 2]), start=1):
            diff = max(abs(torch.from_numpy(a) - b).max().item() for a, b in zip(mine, want))
            assert diff < 1e-5, (r, step, diff)
    assert _apart(ranks[0], ranks[1]) == 0 and _apart(ranks[0], ranks[2]) > 1e-3  # one island agrees, two apart
    # across: each rank's half of the 163 numbers (82, padded), 3 syncs; inside: the 2 x 82 gathered, and
    # every step's gradients (DDP's or flat's all-reduce of 163 numbers)
    # (sharded inside, rank 0's own shard crosses: stage 3's half of each Linear's flat unit, 56 + 26 numbers;
    # fsdp's rows, 8 of 16 and 2 of 3 of each weight and bias: 48 + 8 + 32 + 2)
    assert ranks[0]["wire_bytes_across"] == 3 * 4 * {"fsdp": 90}.get(inner, 82)
    assert ranks[0]["collectives_across"] == ROUNDS  # (one all-reduce a sync: the cost model's latency count)
    if inner in ("ddp", "flat"):  # (zero, fsdp: reduce-scatters and all-gathers, as they count them)
        assert ranks[0]["wire_bytes"] == 3 * 82 * 4 + 3 * 164 * 4 + H * ROUNDS * 163 * 4
    else:
        assert f"{inner}/builtin inside" in ranks[0]["describe"]


def test_hsdp_two_islands_of_two_take_ddps_steps(runs):
    """sync=fsdp with islands (HSDP): sharded over 2 ranks inside, each shard's gradient all-reduced across;
    the steps of DDP over the 4 ranks, and half the gradients a rank across the islands."""
    hsdp, ddp = runs["hsdp"], runs["DDP"]
    assert _apart(hsdp[0], hsdp[2]) == 0  # (the islands agree: every step averaged across them)
    for r in range(4):
        assert _apart(hsdp[r], ddp[r]) < 1e-5
    assert hsdp[0]["describe"] == "fsdp/builtin (HSDP: 2 islands of 2)"
    # across: each rank's half of the 163 gradients (the root unit's Linear(6,16) and Linear(16,3), as counted)
    assert hsdp[0]["wire_bytes_across"] == H * ROUNDS * (163 * 4 // 2)
    assert hsdp[0]["collectives_across"] == 2 * H * ROUNDS  # (each Linear a unit: two all-reduces across a step)


def test_hsdp_with_our_reduce_scatter_inside_takes_ddps_steps_too(runs):
    """sync.algo=direct: FSDP2's reduce-scatter inside each island is ddp_lab's (fsdp_direct.py), the all-reduce
    across torch's."""
    for name, described in (("hsdp direct", "fsdp/direct"), ("hsdp direct overlap", "fsdp/direct+overlap")):
        hsdp, ddp = runs[name], runs["DDP"]  # (overlap: gathers ahead; the reduce-scatter finished for the all-reduce)
        assert _apart(hsdp[0], hsdp[2]) == 0
        for r in range(4):
            assert _apart(hsdp[r], ddp[r]) < 1e-5, name
        assert hsdp[0]["describe"] == f"{described} (HSDP: 2 islands of 2)"
        assert hsdp[0]["wire_bytes_across"] == runs["hsdp"][0]["wire_bytes_across"]


def _eager_int4(rank: int, world_size: int) -> dict:
    return _train(rank, world_size, {"mode": "diloco", "islands": "2", "overlap": 1, "overlap_update": "eager",
                                     "compress": "int4", "rounding": "feedback"})


def test_islands_with_eager_int4_feedback_agree_inside_and_send_a_quarter_across():
    ranks = run_in_processes(_eager_int4, 4, timeout=180)
    assert _apart(ranks[0], ranks[1]) == 0 and _apart(ranks[2], ranks[3]) == 0
    assert _apart(ranks[0], ranks[2]) > 1e-4
    # a half (82 numbers) in 4 bits: 2 blocks of 64 over 2 islands, 1 block a rank: 32 bytes of codes + 4 of scale
    # each way, 2 x 36 bytes a sync
    assert ranks[0]["wire_bytes_across"] == 3 * 2 * 36
    assert ranks[0]["collectives_across"] == 3 * 2  # (the codes' all-to-all, then the mean's all-gather)
    assert "overlap 1 eager" in ranks[0]["describe"] and "+int4" in ranks[0]["describe"]


@pytest.mark.parametrize("over, says", [
    ({"islands": "none", "mode": "diloco", "inner": "flat"},
     "sync/inner=flat is the strategy inside islands, and sync.islands=none makes none: set sync.islands=host (or K), "
     "or leave sync/inner out"),
    ({"islands": "2", "mode": "diloco", "algo": "ring"},
     "sync.islands=2 runs torch's collectives on each island's process group: use sync.algo=builtin, not "
     "sync.algo=ring"),
    ({"islands": "2", "mode": "diloco", "inner": "ddp", "inner_algo": "ring"}, "use sync.inner.algo=builtin, not "
                                                                                "sync.inner.algo=ring"),
    ({"islands": "2", "mode": "diloco", "inner": "fsdp", "inner_islands": "2"},
     "sync.inner.islands=2: islands are made by sync.islands, not by the strategy inside them"),
    ({"islands": "host", "mode": "local_sgd", "local_sgd_start_step": 4}, "use sync.local_sgd_start_step=0"),
    ({"mode": "diloco", "overlap_update": "eager"}, "set sync.overlap to 1 or more"),
    ({"mode": "diloco", "overlap": 1, "eager_proxy": "paper"}, "set sync.overlap_update=eager, or leave sync.eager"),
])
def test_bad_island_settings_are_refused_in_one_line(over, says):
    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace(")", r"\)")) as e:
        check(sync_cfg(**{"every": 4, **over}))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("over, says", [
    ({"islands": "2", "mode": "flat"}, "sync=flat takes no islands"),  # (islands are diloco's, local_sgd's, fsdp's)
    ({"islands": "host", "mode": "fsdp", "inner": "flat"}, "sync=fsdp takes no inner"),  # (HSDP: FSDP2 inside)
    ({"mode": "local_sgd", "overlap_update": "eager", "overlap": 1}, "sync=local_sgd takes no overlap, "
                                                                      "overlap_update"),
    ({"mode": "diloco", "islands": "2", "zero_stage": 3}, "sync=diloco takes no zero_stage"),  # (sync.inner.'s)
])
def test_island_keys_of_another_strategy_are_not_taken(over, says):
    with pytest.raises(TypeError, match=f"^{says}$"):
        sync_cfg(**over)


def test_only_the_strategies_that_may_run_inside_islands_are_taken_there(compose_train):
    with pytest.raises(ConfigError, match=r"^sync.inner=per_param: inside islands runs one of ddp, flat, zero, fsdp$"):
        sync_cfg("diloco", islands="2", inner="per_param")
    cfg = compose_train(["sync=diloco", "sync.islands=2", "sync/inner=zero", "sync.inner.zero_stage=3"])
    assert options_of(cfg.sync) == sync_cfg("diloco", islands="2", inner="zero", inner_zero_stage=3)
    assert options_of(cfg.sync).inside().algo == "builtin"  # (zero inside islands: torch's collectives)
    plain = options_of(compose_train(["sync=diloco", "sync.islands=2", "sync.inner=zero"]).sync)
    assert plain == sync_cfg("diloco", islands="2", inner="zero")  # (the plain key: zero at its defaults inside)


def _uneven_hosts(rank: int, world_size: int) -> str:
    """Hosts of 3 and 1 ranks (torchrun's variables as an elastic change of membership could leave them)."""
    import os
    os.environ["LOCAL_WORLD_SIZE"], os.environ["LOCAL_RANK"] = ("3", str(rank)) if rank < 3 else ("1", "0")
    try:
        build_islands("host", DistEnv(rank, world_size, 0, CPU, "gloo"))
    except ConfigError as e:
        return str(e)
    return ""


def test_hosts_of_unequal_rank_counts_are_refused_on_every_rank():
    said = run_in_processes(_uneven_hosts, 4, timeout=120)
    assert all("sync.islands=host needs every host to run the same number of consecutive ranks" in s for s in said[:3])
    # (the host of one rank: 1 divides 4, and it hears the others' counts too)
    assert "these hosts run [1, 3]" in said[3]


def test_islands_that_do_not_divide_the_world_are_refused():
    with pytest.raises(ConfigError, match="does not divide the 6 ranks"):
        island_size("4", 6, 6)
    with pytest.raises(ConfigError, match=r"sync.islands=host \(LOCAL_WORLD_SIZE=4"):
        island_size("host", 6, 4)
    assert island_size("host", 8, 4) == 4 and island_size("3", 6, 6) == 3
