"""DiLoCo against a reference written here, and its evaluation with BatchNorm.

The reference simulates the same N workers in one process, by DiLoCo's paper (Douillard et
al. 2023, Algorithm 1): each worker takes H steps of its own AdamW (whose state it keeps
across rounds), then the outer gradient, the mean over workers of (anchor - weights), takes
one step of SGD with Nesterov momentum on the anchor, written out (not torch's SGD):
    b <- mu * b + delta;  anchor <- anchor - lr * (delta + mu * b)
and every worker starts the next round from the anchor. Heavy-ball momentum, momentum reset
each round, an ignored outer lr or a reset inner optimizer each move the weights by more
than the 1e-5 allowed here (the sums of 2 ranks in another order than the reference's).
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ddp_lab.config import ConfigError
from ddp_lab.distributed import DistEnv
from ddp_lab.sync import build_sync
from ddp_lab.training.evaluation import evaluate
from tests.multiproc import run_in_processes
from tests.sync import sync_cfg

H, ROUNDS, LR, MU, N, BATCH = 3, 3, 0.7, 0.9, 2, 8
CPU = torch.device("cpu")


def _model():
    torch.manual_seed(0)
    # (no bias before the BatchNorm: its gradient is rounding noise, which AdamW scales up to a full step)
    return nn.Sequential(nn.Linear(6, 8, bias=False), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def _data():
    g = torch.Generator().manual_seed(3)
    return torch.randn(H * ROUNDS, N, BATCH, 6, generator=g), torch.randint(0, 3, (H * ROUNDS, N, BATCH), generator=g)


def _inner(params):
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)


# Streaming DiLoCo's fragments of _model's parameters (48, 8, 8, 24 and 3 elements): by hand, in halves
FRAGMENTS = {1: [[0, 1, 2, 3, 4]], 2: [[0], [1, 2, 3, 4]]}


def reference(overlap: int = 0, mix: float = 0.0, fragments: int = 1, eager: bool = False, end: bool = False,
              proxy: str = "local") -> list[list[list[torch.Tensor]]]:
    """Each worker's parameters after every step (the anchor after the last step of a round). With
    overlap (Streaming DiLoCo), the outer gradients taken at a round's end are applied `overlap` steps
    later, and each worker keeps `mix` of the weights it reached in between. With fragments, fragment f's
    round ends at step f*H//F of each H instead (its first round is shorter). Eager (Kale et al. 2025): at
    a round's end each worker steps from the anchor at once with its proxy of the mean (local: its own outer
    gradient; paper: (own + N mean_last - own_last) / N), and when the mean lands adds the true anchor's
    difference from its proxy one."""
    x, y = _data()
    workers = [_model() for _ in range(N)]
    opts = [_inner(w.parameters()) for w in workers]
    anchor = [p.detach().clone() for p in workers[0].parameters()]
    buf = [torch.zeros_like(a) for a in anchor]
    seen = [[] for _ in range(N)]
    groups = FRAGMENTS[fragments]
    sent = [None] * fragments  # per fragment: (the step, the mean outer gradient of each of its parameters)
    proxies = [None] * fragments  # eager, per fragment: each worker's proxy anchor of each parameter
    last = [None] * fragments  # eager, per fragment: (the last mean, each worker's own of that round)

    def outer_step(i, delta, b):
        b = MU * b + delta
        return anchor[i] - LR * (delta + MU * b), b

    def land(f, mix):
        _, delta = sent[f][:2]
        for i in groups[f]:
            anchor[i], buf[i] = outer_step(i, delta[i], buf[i])
            for r, w in enumerate(workers):
                p = list(w.parameters())[i]
                p.copy_(p + anchor[i] - proxies[f][r][i] if eager else mix * p + (1 - mix) * anchor[i])
        if eager:
            last[f] = (delta, sent[f][2])
        sent[f] = None

    def take_proxy_step(f):
        _, _, own = sent[f]
        proxies[f] = []
        for r, w in enumerate(workers):
            mine = {}
            for i in groups[f]:
                g = own[r][i] if proxy == "local" else \
                    own[r][i] / N if last[f] is None else last[f][0][i] + (own[r][i] - last[f][1][r][i]) / N
                mine[i] = outer_step(i, g, buf[i])[0]
                list(w.parameters())[i].copy_(mine[i])
            proxies[f].append(mine)

    for step in range(1, H * ROUNDS + 1):
        for r, (w, opt) in enumerate(zip(workers, opts)):
            F.cross_entropy(w(x[step - 1, r]), y[step - 1, r]).backward()
            opt.step()
            opt.zero_grad()
        with torch.no_grad():
            for f in range(fragments):
                if sent[f] is not None and step == sent[f][0] + overlap:
                    land(f, mix)
            for f, group in enumerate(groups):
                if step % H == f * H // fragments:
                    own = [{i: anchor[i] - list(w.parameters())[i] for i in group} for w in workers]
                    sent[f] = (step, {i: sum(o[i] for o in own) / N for i in group}, own)
                    if not overlap:
                        land(f, 0.0)
                    elif eager:
                        take_proxy_step(f)
        for r, w in enumerate(workers):
            seen[r].append([p.detach().clone() for p in w.parameters()])
    if end:  # the run ends on a sync step: what was sent at it lands at once, and every worker holds the anchor
        with torch.no_grad():
            for f in range(fragments):
                if sent[f] is not None:
                    land(f, 0.0)
        return [a.clone() for a in anchor]
    return seen


def _run(rank: int, world_size: int, overlap: int = 0, mix: float = 0.5, fragments: int = 1,
         update: str = "delayed", proxy: str = "local") -> dict:
    x, y = _data()
    env = DistEnv(rank, world_size, 0, CPU, "gloo")
    model = _model()
    sync = build_sync(sync_cfg("diloco", every=H, outer_lr=LR, outer_momentum=MU, overlap=overlap,
                               overlap_mix=mix, fragments=fragments, overlap_update=update, eager_proxy=proxy),
                      model, env)
    opt = _inner(model.parameters())
    steps, evaluated = [], {}
    for step in range(H * ROUNDS):
        F.cross_entropy(sync.module(x[step, rank]), y[step, rank]).backward()
        sync.after_backward()
        opt.step()
        opt.zero_grad()
        sync.after_step(step + 1)
        steps.append([p.detach().numpy().copy() for p in model.parameters()])
        if step + 1 == H + 1:  # between synchronisations: each rank's BatchNorm statistics its own
            own = [b.numpy().copy() for b in model.buffers()]
            anchor = copy.deepcopy(model)  # what an evaluation must score: the anchor, its buffers
            with torch.no_grad():
                for t, a in zip([*anchor.parameters(), *[b for b in anchor.buffers() if b.is_floating_point()]],
                                sync.anchor + sync.anchor_buffers):
                    t.copy_(a)
            loader = _Loader(x[0].flatten(0, 1)[rank::2], y[0].flatten(0, 1)[rank::2])
            with sync.consensus():
                evaluated["scored"] = evaluate(sync.module, loader, env)
            evaluated["own_after"] = [b.numpy().copy() for b in model.buffers()]
            evaluated["own"] = own
            # (numpy arrays: tensors would go back through shared memory the ending rank takes along)
            evaluated["anchor_model"] = {k: v.numpy().copy() for k, v in anchor.state_dict().items()}
    counted = {"bytes": sync.wire_bytes, "collectives": sync.collectives}
    sync.finish(H * ROUNDS)
    return {"steps": steps, "describe": sync.describe(), "fragments": sync.fragments, **counted,
            "finished": [p.detach().numpy().copy() for p in model.parameters()], **evaluated}


class _Loader:
    """The evaluation's loader: one batch."""

    def __init__(self, x, y):
        self.batch = (x, y)

    def __len__(self):
        return 1

    def epoch(self, _):
        return [self.batch]


@pytest.fixture(scope="module")
def ranks():
    return run_in_processes(_run, N, timeout=120)


def test_diloco_takes_the_steps_of_its_reference(ranks):
    ref = reference()
    for r, got in enumerate(ranks):
        for step, (mine, want) in enumerate(zip(got["steps"], ref[r]), start=1):
            diff = max(abs(torch.from_numpy(a) - b).max().item() for a, b in zip(mine, want))
            assert diff < 1e-5, (r, step, diff)
    # the ranks apart between synchronisations, by far more than the tolerance; the same after them
    apart = max(abs(a - b).max() for a, b in zip(ranks[0]["steps"][H], ranks[1]["steps"][H]))
    assert apart > 1e-3, apart
    assert all((a == b).all() for a, b in zip(ranks[0]["steps"][-1], ranks[1]["steps"][-1]))


def test_overlapped_diloco_takes_the_steps_of_its_reference():
    """sync.overlap=1: each outer step lands one inner step late, mixed half and half into the weights."""
    ranks, ref = run_in_processes(_run, N, 1, 0.5, timeout=120), reference(overlap=1, mix=0.5)
    for r, got in enumerate(ranks):
        for step, (mine, want) in enumerate(zip(got["steps"], ref[r]), start=1):
            diff = max(abs(torch.from_numpy(a) - b).max().item() for a, b in zip(mine, want))
            assert diff < 1e-5, (r, step, diff)
    # it differs from DiLoCo without overlap, and the ranks stay apart after a landing (each keeps half its own)
    plain = reference()
    assert max(abs(torch.from_numpy(a) - b).max().item() for a, b in zip(ranks[0]["steps"][-1], plain[0][-1])) > 1e-3
    assert any((a != b).any() for a, b in zip(ranks[0]["steps"][H], ranks[1]["steps"][H]))
    assert ranks[0]["describe"] == "diloco/builtin(every 3, outer lr 0.7, momentum 0.9, overlap 1 mix 0.5)"


@pytest.mark.parametrize("fragments, proxy", [(1, "local"), (2, "local"), (1, "paper")])
def test_eager_outer_updates_take_the_steps_of_their_reference(fragments, proxy):
    """sync.overlap_update=eager, overlap 2: each rank steps from its proxy anchor at once and corrects by the
    true anchor when the mean lands two steps later; not the delayed update, and at the last step (a landing
    is not due) the ranks' weights differ."""
    ranks = run_in_processes(_run, N, 2, 0.5, fragments, "eager", proxy, timeout=120)
    ref = reference(2, 0, fragments, True, proxy=proxy)
    for r, got in enumerate(ranks):
        for step, (mine, want) in enumerate(zip(got["steps"], ref[r]), start=1):
            diff = max(abs(torch.from_numpy(a) - b).max().item() for a, b in zip(mine, want))
            assert diff < 1e-5, (r, step, diff)
    if fragments == 1:  # sent at the last step: it lands at once at the end, as blocking DiLoCo's would
        end = reference(2, 0, 1, True, end=True, proxy=proxy)
        for got in ranks:
            assert max(abs(torch.from_numpy(a) - b).max().item() for a, b in zip(got["finished"], end)) < 1e-5
    delayed = reference(2, 0.5, fragments)
    assert max(abs(torch.from_numpy(a) - b).max().item() for a, b in zip(ranks[0]["steps"][-1], delayed[0][-1])) > 1e-3
    # right after a sync (step H) each rank holds its own proxy anchor: apart
    assert any((a != b).any() for a, b in zip(ranks[0]["steps"][H - 1], ranks[1]["steps"][H - 1]))
    assert ("overlap 2 eager (paper's proxy)" in ranks[0]["describe"]) == (proxy == "paper")
    if proxy == "paper":  # (the two proxies part: the local one's steps are not the paper's)
        local = reference(2, 0, fragments, True)[0][-1]
        assert max(abs(torch.from_numpy(a) - b).max().item() for a, b in zip(ranks[0]["steps"][-1], local)) > 1e-4


@pytest.mark.parametrize("overlap", [0, 1])
def test_diloco_in_staggered_fragments_takes_the_steps_of_its_reference(overlap):
    """sync.fragments=2: the first layer's weight syncs at steps 3, 6, 9, the rest at 1, 4, 7 (each half the
    bytes), blocking or landing a step late."""
    ranks, ref = run_in_processes(_run, N, overlap, 0.5, 2, timeout=120), reference(overlap, 0.5 * overlap, 2)
    assert ranks[0]["fragments"] == [(0, 1), (1, 5)]
    for r, got in enumerate(ranks):
        for step, (mine, want) in enumerate(zip(got["steps"], ref[r]), start=1):
            diff = max(abs(torch.from_numpy(a) - b).max().item() for a, b in zip(mine, want))
            assert diff < 1e-5, (r, step, diff)
    # not DiLoCo of the whole model at once; every parameter's outer gradient sent 3 times, each fragment's
    # apart, and BatchNorm's 16 statistics averaged as fragment 0 lands (with overlap 1 its third, sent at step
    # 9, would land at step 10)
    whole = reference(overlap, 0.5 * overlap)
    assert max(abs(torch.from_numpy(a) - b).max().item() for a, b in zip(ranks[0]["steps"][-1], whole[0][-1])) > 1e-3
    landed = 3 - overlap
    assert ranks[0]["bytes"] == (3 * 91 + landed * 16) * 4 and ranks[0]["collectives"] == 3 * 2 + landed
    if not overlap:  # after step 1 the second fragment is the ranks' anchor, the first each rank's own
        first, rest = ([torch.from_numpy(r["steps"][0][i]) for r in ranks] for i in (0, 3))
        assert (rest[0] == rest[1]).all() and (first[0] != first[1]).any()
    assert ranks[0]["describe"].endswith(", fragments 2)")


def test_an_evaluation_scores_the_anchor_with_its_buffers_and_leaves_each_rank_its_own(ranks):
    assert any((a != b).any() for a, b in zip(ranks[0]["own"], ranks[1]["own"]))  # statistics apart
    for r in ranks:
        assert all((a == b).all() for a, b in zip(r["own_after"], r["own"]))  # each rank's own, back
    # one process scoring the anchor (its weights and its averaged buffers) on the whole held-out batch
    x, y = _data()
    model = _model()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in ranks[0]["anchor_model"].items()})
    single = evaluate(model, _Loader(x[0].flatten(0, 1), y[0].flatten(0, 1)), DistEnv(0, 1, 0, CPU, "none"))
    assert ranks[0]["scored"] == ranks[1]["scored"]
    assert abs(ranks[0]["scored"][0] - single[0]) < 1e-4 and ranks[0]["scored"][1:] == single[1:]


def _compressed(rank: int, world_size: int) -> dict:
    """Two rounds of DiLoCo on a 2,762-parameter MLP, its outer gradients in 32, 8 and 4 bits."""
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(2 * H, N, BATCH, 32, generator=g), torch.randint(0, 10, (2 * H, N, BATCH), generator=g)
    env, out = DistEnv(rank, world_size, 0, CPU, "gloo"), {}
    for compress, overlap in (("none", 0), ("int8", 0), ("int4", 0), ("none", 1), ("int4", 1), ("int4", 2)):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
        start = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        sync = build_sync(sync_cfg("diloco", compress=compress, every=H, outer_lr=LR, outer_momentum=MU,
                                   overlap=overlap, overlap_mix=0.5, rounding="nearest"), model, env)
        opt = _inner(model.parameters())
        halfway = []  # overlap 2: whether the all-gather had started, after each step of the first round's sync
        for step in range(2 * H):
            F.cross_entropy(sync.module(x[step, rank]), y[step, rank]).backward()
            opt.step()
            opt.zero_grad()
            sync.after_step(step + 1)
            if overlap == 2 and step + 1 in (H, H + 1):
                halfway.append(sync.sent[0].work.second is not None)
        weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        anchor = torch.cat([a.reshape(-1) for a in sync.anchor])
        out[compress + ["", "+overlap", "+overlap2"][overlap]] = {
            "weights": weights.numpy(), "moved": (weights - start).norm().item(), "anchor": anchor.numpy(),
            "anchor_moved": (anchor - start).norm().item(), "bytes": sync.wire_bytes, "describe": sync.describe(),
            "halfway": halfway}
    return out


def test_outer_gradients_in_8_and_4_bits_stay_near_fp32s_for_a_quarter_and_a_seventh_of_the_bytes():
    ranks = run_in_processes(_compressed, N, timeout=120)
    full = ranks[0]["none"]
    for compress, close, fewer in (("int8", 0.02, 3.5), ("int4", 0.2, 6)):  # (measured: 0.5% and 10%)
        got = ranks[0][compress]
        assert all((r[compress]["weights"] == got["weights"]).all() for r in ranks)  # synchronised: one model
        off = float(((got["weights"] - full["weights"]) ** 2).sum() ** 0.5)  # against how far fp32's moved
        assert 0 < off < close * full["moved"], (compress, off, full["moved"])
        assert full["bytes"] / got["bytes"] > fewer, (compress, full["bytes"], got["bytes"])
        assert got["describe"].endswith(f"+{compress}")


def test_overlapped_outer_gradients_in_4_bits_land_as_the_blocking_ones_would():
    """sync.overlap=1 with int4: the quantized mean's all-to-all travels in the background and its
    all-gather runs as the outer step lands. The anchor (the same on every rank) stays near the overlapped
    fp32 anchor, as int4's does near fp32's, for int4's bytes."""
    ranks = run_in_processes(_compressed, N, timeout=120)
    full, got = ranks[0]["none+overlap"], ranks[0]["int4+overlap"]
    assert all((r["int4+overlap"]["anchor"] == got["anchor"]).all() for r in ranks)
    off = float(((got["anchor"] - full["anchor"]) ** 2).sum() ** 0.5)
    assert 0 < off < 0.2 * full["anchor_moved"], (off, full["anchor_moved"])
    assert got["bytes"] == ranks[0]["int4"]["bytes"]  # the same quantized messages, sent later
    assert got["describe"].endswith("overlap 1 mix 0.5)+int4")
    # TAU=2: the all-gather starts halfway (after step H+1), not when the outer step lands (H+2)
    assert all(r["int4+overlap2"]["halfway"] == [False, True] for r in ranks)
    assert ranks[0]["int4+overlap2"]["anchor_moved"] > 0
    assert all((r["int4+overlap2"]["anchor"] == ranks[0]["int4+overlap2"]["anchor"]).all() for r in ranks)


def _load_checkpoints(rank: int, world_size: int) -> dict:
    def built(fragments):
        return build_sync(sync_cfg("diloco", every=4, outer_lr=LR, outer_momentum=MU, overlap=2, overlap_mix=0.5,
                                   fragments=fragments), _model(), DistEnv(rank, world_size, 0, CPU, "gloo"))
    saved = built(1).state_dict()
    sent = torch.arange(91.0)
    out = {}
    one = built(1)  # a checkpoint from before fragments: one step, one tensor
    one.load_state_dict({**saved, "sent_at": 8}, {"sent": sent})
    out["old"] = [(s.step, s.outer_grad.tolist()) if s else None for s in one.sent]
    one.after_step(10)  # it lands: sent again, its bytes not counted twice (the launch that sent it counted them)
    out["bytes at the landing"] = one.wire_bytes
    gone = built(1)  # the same at another world size: no file of this rank's
    gone.load_state_dict({**saved, "sent_at": 8}, None)
    out["other world"] = gone.sent
    two = built(2)
    two.load_state_dict({**saved, "sent_at": [None, 6]}, {"sent": [None, sent[48:]]})
    out["fragments"] = [(s.step, len(s.outer_grad)) if s else None for s in two.sent]
    try:
        built(2).load_state_dict({**saved, "sent_at": [8]}, {"sent": [sent]})
    except ConfigError as e:
        out["refused"] = str(e)
    return out


def test_a_checkpoint_keeps_each_fragments_outer_gradient_in_flight_and_old_ones_still_load():
    got = run_in_processes(_load_checkpoints, 1, timeout=60)[0]
    assert got["old"] == [(8, list(range(91)))]
    assert got["bytes at the landing"] == 16 * 4  # BatchNorm's 16 statistics averaged, the 91 numbers not counted
    assert got["other world"] == [None]
    assert got["fragments"] == [None, (6, 43)]
    assert got["refused"] == ("the checkpoint was saved with sync.fragments=1 while an outer gradient travelled: "
                              "resume with sync.fragments=1")
