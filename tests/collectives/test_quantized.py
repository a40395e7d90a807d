"""The quantized mean (sync.compress=int8|int4 under DiLoCo): each number within the rounding
its block's scale allows of the true mean, the same on every rank, and the bytes counted."""
from __future__ import annotations

import pytest
import torch

from ddp_lab.collectives.basics import Pending
from ddp_lab.collectives.quantized import (
    BLOCK,
    Residual,
    dequantize,
    message_bytes,
    quantize,
    quantized_mean_,
    start_quantized_mean,
)
from tests.multiproc import run_in_processes


def _sample(seed: int, numel: int = 10 * BLOCK + 17) -> torch.Tensor:
    """Blocks of very different sizes (as a model's layers have), one of them all zeros."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=g) * torch.logspace(-6, 1, numel).flip(0)
    x[BLOCK:2 * BLOCK] = 0
    return x


@pytest.mark.parametrize("bits", [8, 4])
def test_each_number_comes_back_within_half_a_level_of_its_block(bits):
    x = _sample(0)[:10 * BLOCK]
    codes, scales = quantize(x, bits)
    assert codes.dtype == torch.uint8 and codes.numel() == x.numel() * bits // 8
    back = dequantize(codes, scales, bits)
    top = 2 ** (bits - 1) - 1
    assert torch.equal(scales, x.view(-1, BLOCK).abs().amax(1) / top)
    err = (back - x).abs().view(-1, BLOCK)
    assert (err <= scales[:, None] / 2 * (1 + 1e-5)).all()
    assert (back[BLOCK:2 * BLOCK] == 0).all()  # a zero block stays zero (no division by 0)
    assert back.view(-1, BLOCK).abs().amax(1).sub(x.view(-1, BLOCK).abs().amax(1)).abs().max() < 1e-6  # tops exact
    assert message_bytes(x.numel(), bits) == x.numel() * bits // 8 + x.numel() // BLOCK * 4


def _mean(rank: int, world_size: int) -> dict:
    x = _sample(rank)
    out = {}
    for compress in ("int8", "int4"):
        y = x.clone()
        out[compress] = (quantized_mean_(y, compress), y.numpy().copy())
    return out


@pytest.mark.parametrize("n", [2, 3])
def test_every_rank_gets_the_same_mean_within_the_rounding_allowed(n):
    ranks = run_in_processes(_mean, n, timeout=120)
    xs = [_sample(r) for r in range(n)]
    true = sum(xs) / n
    chunk = -(-true.numel() // (n * BLOCK)) * BLOCK
    padded = torch.zeros(n * chunk)
    for compress, bits in (("int8", 8), ("int4", 4)):
        got = torch.from_numpy(ranks[0][compress][1])
        assert all((r[compress][1] == ranks[0][compress][1]).all() for r in ranks)  # bit for bit
        # rounded twice: each rank's piece (half a level of its block's scale, / n) and the mean
        top = 2 ** (bits - 1) - 1
        allowed = sum(pad(x, padded).view(-1, BLOCK).abs().amax(1) / top / 2 for x in xs) / n
        allowed += pad(true, padded).view(-1, BLOCK).abs().amax(1) * (1 + 1 / top) / top / 2
        err = pad(got - true, padded).abs().view(-1, BLOCK)
        assert (err <= allowed[:, None] * (1 + 1e-4)).all(), compress
        assert (got - true).abs().max() > 0  # rounded: not the exact mean
        sent = ranks[0][compress][0]
        assert sent == n * message_bytes(chunk, bits)
        # against fp32's bytes (of the padded buffer: padding to whole blocks costs little on a real model)
        assert 4 * n * chunk / sent == pytest.approx(32 / (bits + 0.5))


def pad(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    out = like.clone()
    out[:x.numel()] = x
    return out


def _in_two_phases(rank: int, world_size: int) -> dict:
    x = _sample(rank)
    at_once, halves = x.clone(), x.clone()
    quantized_mean_(at_once, "int4")
    under_way, _ = start_quantized_mean(halves, "int4")
    started = under_way.second is None  # only the all-to-all posted
    under_way.advance()  # the all-to-all waited for, the all-gather posted and left travelling
    halfway = isinstance(under_way.second, Pending) and under_way.second.finish is not None
    untouched = torch.equal(halves, x)  # nothing written before the wait
    under_way.wait()
    return {"started": started, "halfway": halfway, "untouched": untouched, "equal": torch.equal(halves, at_once)}


@pytest.mark.parametrize("n", [2, 3])
def test_a_mean_advanced_halfway_ends_as_the_blocking_one_bit_for_bit(n):
    """DiLoCo's overlap advances the quantized mean halfway: the all-gather then travels in the background."""
    for r in run_in_processes(_in_two_phases, n, timeout=120):
        assert r == {"started": True, "halfway": True, "untouched": True, "equal": True}


ROUNDS = 40


def _rounds(rank: int, world_size: int, rounding: str) -> dict:
    """ROUNDS means of outer gradients whose blocks each hold an outlier (100) among small numbers near 1, which
    round to zero in 4 bits (a level is 100/7): the sum of what arrived against the sum of the true means."""
    residual = Residual() if rounding == "feedback" else None
    true = got = torch.zeros(4 * BLOCK)
    for t in range(ROUNDS):
        g = torch.Generator().manual_seed(100 * t + rank)
        x = 1.0 + 0.3 * torch.randn(4 * BLOCK, generator=g)
        x[::BLOCK] = 100.0
        noise = torch.Generator().manual_seed(7 * t + rank) if rounding == "stochastic" else None
        mean = x.clone()
        pending, _ = start_quantized_mean(mean, "int4", None, residual, noise)
        pending.wait()
        every = [torch.zeros_like(x) for _ in range(world_size)]
        torch.distributed.all_gather(every, x)
        true, got = true + sum(every) / world_size, got + mean
    return {"error": (got - true).abs().max().item(), "bias": (got - true).mean().item()}


@pytest.mark.parametrize("rounding", ["feedback", "nearest", "stochastic"])
def test_error_feedback_keeps_the_sum_of_what_arrives_on_the_sum_of_the_true_means(rounding):
    """Over 40 rounds: to nearest, the small numbers never arrive (the sum falls behind by about 40); with
    error feedback it stays within a round's rounding (a level is 100/7) of the truth; stochastic rounding is
    unbiased on average but wanders."""
    r = run_in_processes(_rounds, 2, rounding, timeout=120)[0]
    if rounding == "feedback":
        assert r["error"] < 100 / 7 and abs(r["bias"]) < 100 / 7 / 2  # (measured: 10.1 and 2.4)
    elif rounding == "nearest":
        assert r["error"] > 30 and r["bias"] < -30
    else:
        assert abs(r["bias"]) < 5 and r["error"] > 100 / 7
