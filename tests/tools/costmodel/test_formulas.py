"""ddp_lab.tools.costmodel's arithmetic: the formulas, the non-negative fit, predictions."""
from __future__ import annotations

import pytest
import torch

from ddp_lab.tools import costmodel as cm
from ddp_lab.tools.costmodel.formulas import PHASES
from tests.helpers.costmodel import ALPHA, BETA, GAMMA, SIZES

WORLDS = [2, 4, 8]


def synthetic(model, noise: float = 0.0, seed: int = 0, worlds=WORLDS):
    g = torch.Generator().manual_seed(seed)
    pts = []
    for p in worlds:
        for n in SIZES:
            t = model(p, n, ALPHA, BETA, GAMMA)
            if noise:
                t *= 1.0 + noise * float(torch.randn((), generator=g))
            pts.append(cm.Point("x", p, n, t))
    return pts


# ----------------------------------------------------------------- formulas
def test_formulas_on_a_hand_computed_case():
    a, b, g, n = 1e-5, 1e-9, 1e-10, 1e6
    assert cm.ring(8, n, a, b, g) == pytest.approx(14 * a + 1.75e-3 + 8.75e-5)          # 1.9775 ms
    assert cm.halving_doubling(8, n, a, b, g) == pytest.approx(6 * a + 1.75e-3 + 8.75e-5)  # 1.8975 ms
    assert cm.naive(8, n, a, b, g) == pytest.approx(14 * (a + 1e-3) + 7e-4)             # 14.84 ms
    assert cm.tree(8, n, a, b, g) == pytest.approx(6 * (a + 1e-3) + 3e-4)                # 6.36 ms
    # p = 6 is not a power of two: p' = 4, plus the fold-in (a+Nb+Ng) and fold-out (a+Nb) steps
    assert cm.halving_doubling(6, n, a, b, g) == pytest.approx(
        4 * a + 1.5e-3 + 7.5e-5 + (a + 1e-3 + 1e-4) + (a + 1e-3))                       # 3.735 ms
    assert cm.tree(6, n, a, b, g) == pytest.approx(cm.tree(8, n, a, b, g))  # ceil(log2 6) = 3
    for model in cm.MODELS.values():
        assert model(1, n, a, b, g) == 0.0  # one rank: nothing to communicate


def test_the_rings_two_phases_on_a_hand_computed_case_and_their_sum():
    # p=4, N=8e6 bytes, alpha 1e-4 s, beta 1e-9 s/B, gamma 2e-10 s/B: each phase moves 3/4 of N
    rs, ag = PHASES["reduce_scatter"], PHASES["all_gather"]
    assert rs(4, 8e6, 1e-4, 1e-9, 2e-10) == pytest.approx(3e-4 + 6e-3 + 1.2e-3)
    assert ag(4, 8e6, 1e-4, 1e-9, 2e-10) == pytest.approx(3e-4 + 6e-3)
    for p in (2, 3, 5, 8):  # the all-reduce is one then the other
        assert rs(p, 1e6, 1e-5, 2e-9, 3e-10) + ag(p, 1e6, 1e-5, 2e-9, 3e-10) == pytest.approx(
            cm.ring(p, 1e6, 1e-5, 2e-9, 3e-10))
    assert rs(1, 1e6, 1, 1, 1) == ag(1, 1e6, 1, 1, 1) == 0  # one rank sends nothing


def test_models_table_names_match_the_benchmark():
    from ddp_lab.collectives import ALGORITHMS

    assert set(ALGORITHMS) <= set(cm.MODELS)
    assert cm.MODELS["builtin"] is cm.ring and "tree" in cm.MODELS


def test_direct_pays_two_latencies_and_the_rings_bytes():
    # p=4, N=8e6 bytes, alpha 1e-4 s, beta 1e-9 s/B, gamma 2e-10 s/B: 2 alpha, 2 x 3/4 N beta, 3/4 N gamma
    assert cm.direct(4, 8e6, 1e-4, 1e-9, 2e-10) == pytest.approx(2e-4 + 1.2e-2 + 1.2e-3)
    assert cm.direct(64, 8e6, 1e-4, 1e-9, 0) == pytest.approx(cm.ring(64, 8e6, 1e-4, 1e-9, 0) - 124e-4)
    assert cm.direct(1, 8e6, 1, 1, 1) == 0  # one rank sends nothing


def test_predictions_grow_with_world_size_and_message_size():
    params = cm.Params(ALPHA, BETA, GAMMA)
    for name, model in cm.MODELS.items():
        by_p = [params.time(model, p, 1e7) for p in (2, 4, 8, 64, 512, 4096)]
        assert by_p == sorted(by_p), name
        by_n = [params.time(model, 64, n) for n in SIZES]
        assert by_n == sorted(by_n), name
    # without latency, ring's time is bounded in p (bandwidth-optimal), naive's grows linearly
    bw = cm.Params(0.0, BETA, GAMMA)
    assert bw.time(cm.ring, 4096, 1e8) < 1.02 * bw.time(cm.ring, 64, 1e8)
    assert bw.time(cm.naive, 4096, 1e8) == pytest.approx(4095 / 63 * bw.time(cm.naive, 64, 1e8))


def test_prediction_step_time_and_efficiency():
    grad = cm.Gradient("g", 10 ** 6, None)
    params = cm.Params(1e-5, 1e-9, 1e-10, "test")
    preds = cm.predict(params, "ring", grad, [8, 64], compute_s=2e-3, params_name="t")
    assert preds[0].allreduce_s == pytest.approx(1.9775e-3)
    assert preds[0].step_s == pytest.approx(2e-3 + 1.9775e-3)
    assert preds[0].efficiency == pytest.approx(2e-3 / (2e-3 + 1.9775e-3))
    assert preds[1].efficiency < preds[0].efficiency


# ------------------------------------------------------------------- fitting
@pytest.mark.parametrize("algo", ["naive", "ring", "halving_doubling", "tree"])
def test_fit_recovers_known_parameters(algo):
    f = cm.fit(synthetic(cm.MODELS[algo]), cm.MODELS[algo], gamma=GAMMA, algo=algo)
    assert f.params.alpha == pytest.approx(ALPHA, rel=0.02)
    assert f.params.beta == pytest.approx(BETA, rel=0.02)
    assert f.params.gamma == GAMMA
    assert f.max_abs_err < 1e-6


@pytest.mark.parametrize("algo", ["ring", "halving_doubling"])
def test_fit_with_noise_stays_close(algo):
    f = cm.fit(synthetic(cm.MODELS[algo], noise=0.05, seed=1), cm.MODELS[algo], gamma=GAMMA, algo=algo)
    assert f.params.alpha == pytest.approx(ALPHA, rel=0.15)
    assert f.params.beta == pytest.approx(BETA, rel=0.10)
    assert 0.01 < f.median_abs_err < 0.08


def test_fit_with_shared_cores_recovers_per_rank_parameters():
    # 2, 4 and 8 ranks measured on a 2-core host: 4 ranks take 2x, 8 ranks 4x the formula
    pts = [cm.Point("ring", pt.world_size, pt.size_bytes, pt.time_s * cm.contention(pt.world_size, 2))
           for pt in synthetic(cm.ring)]
    f = cm.fit(pts, cm.ring, gamma=GAMMA, cores=2)
    assert f.params.alpha == pytest.approx(ALPHA, rel=0.02)
    assert f.params.beta == pytest.approx(BETA, rel=0.02)
    assert f.max_abs_err < 1e-6
    assert cm.fit(pts, cm.ring, gamma=GAMMA).median_abs_err > 0.2  # the textbook formula cannot follow
    assert cm.contention(2, 2) == 1.0 and cm.contention(1, 4) == 1.0 and cm.contention(8, None) == 1.0


def test_fit_is_non_negative():
    # Pure bandwidth data (alpha = 0) plus noise: plain least squares may go below zero.
    g = torch.Generator().manual_seed(3)
    pts = [cm.Point("ring", p, n, cm.ring(p, n, 0.0, BETA, 0.0) * (1 + 0.1 * float(torch.randn((), generator=g))))
           for p in WORLDS for n in SIZES]
    f = cm.fit(pts, cm.ring, gamma=0.0)
    assert f.params.alpha >= 0 and f.params.beta >= 0
    assert f.params.beta == pytest.approx(BETA, rel=0.1)


def test_nnls_matches_the_unconstrained_solution_when_it_is_feasible():
    a = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    x = cm.nnls(a, a @ torch.tensor([2.0, 3.0], dtype=torch.float64))
    assert x.tolist() == pytest.approx([2.0, 3.0])
    # the unconstrained optimum has x1 < 0: NNLS clamps it to 0 and refits x0
    y = torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64)
    x = cm.nnls(a, y)
    assert x[1] == 0.0 and x[0] == pytest.approx(0.5)


def test_gamma_cannot_be_fitted_with_beta():
    with pytest.raises(ValueError, match="beta and gamma cannot be fitted separately"):
        cm.fit(synthetic(cm.ring), cm.ring, gamma=None, algo="ring")


def test_measure_gamma_is_plausible():
    g = cm.measure_gamma(sizes=(1 << 22,), repeats=2)
    assert 1e-13 < g < 1e-8  # between 100 GB/s and 0.1 GB/s of float32 additions


# ------------------------------------------------------------------- inputs
