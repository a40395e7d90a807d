"""Cost formulas of allreduce algorithms in the alpha-beta-gamma model.

Each formula prices an allreduce of N bytes on p ranks from three machine
constants (see ddp_lab.tools.costmodel): alpha seconds per message, beta seconds per
byte sent over a link, gamma seconds per byte reduced. All are linear in the
three, which is what makes fitting them a least-squares problem.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from ddp_lab.config import ConfigError


def _pof2_floor(p: int) -> int:
    """Largest power of two <= p."""
    return 1 << (int(p).bit_length() - 1)


def naive(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    """Reduce to a root, broadcast from it, as ddp_lab.collectives implements it.

    The root receives p-1 messages of N bytes, adds each, and sends p-1 back:
    2(p-1)(alpha + N beta) + (p-1) N gamma. Linear in p.
    """
    return 2 * (p - 1) * (alpha + n * beta) + (p - 1) * n * gamma


def ring(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    """Ring reduce-scatter + all-gather: 2(p-1) alpha + 2(p-1)/p N beta + (p-1)/p N gamma.

    Bandwidth-optimal (the beta term stays below 2 N beta for any p); the
    latency term grows linearly with p.
    """
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta + (p - 1) / p * n * gamma


def ring_reduce_scatter(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    """The ring's first phase alone, on an N-byte buffer (each rank keeps the sum of N/p):
    (p-1) alpha + (p-1)/p N beta + (p-1)/p N gamma. Sharded data parallelism's gradient
    step (ZeRO stage 2 and 3, FSDP) is one of these instead of an all-reduce."""
    return (p - 1) * alpha + (p - 1) / p * n * beta + (p - 1) / p * n * gamma


def ring_all_gather(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    """The ring's second phase alone, to an N-byte buffer (each rank gives N/p): nothing to
    add, (p-1) alpha + (p-1)/p N beta. Sharded weights are gathered so before they are used."""
    return (p - 1) * alpha + (p - 1) / p * n * beta


def direct(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    """Every chunk straight to its owner, then every sum to every rank, each phase one step of
    p-1 messages at once: 2 alpha + 2(p-1)/p N beta + (p-1)/p N gamma, on a switch whose links
    all carry their share at once (a rank's p-1 messages then share its link: the ring's bytes)."""
    return 2 * alpha + 2 * (p - 1) / p * n * beta + (p - 1) / p * n * gamma if p > 1 else 0.0


def halving_doubling(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    """Rabenseifner: recursive-halving reduce-scatter + recursive-doubling all-gather.

    For p a power of two: 2 log2(p) alpha + 2(p-1)/p N beta + (p-1)/p N gamma.
    Otherwise, as in the paper (and MPICH), with p' the largest power of two
    below p: the first 2(p - p') ranks fold in pairwise (one full message and
    its addition, alpha + N beta + N gamma), the p' remaining ranks run the
    power-of-two algorithm, and the folded-out ranks get the result back at the
    end (alpha + N beta).
    """
    q = _pof2_floor(p)
    t = 2 * math.log2(q) * alpha + 2 * (q - 1) / q * n * beta + (q - 1) / q * n * gamma
    if q != p:
        t += (alpha + n * beta + n * gamma) + (alpha + n * beta)
    return t


def tree(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    """Binomial-tree reduce, then binomial-tree broadcast, whole message at each step.

    2 ceil(log2 p) (alpha + N beta) + ceil(log2 p) N gamma: few messages, but
    every step moves all N bytes, so it is for small messages only.
    """
    steps = math.ceil(math.log2(p)) if p > 1 else 0
    return 2 * steps * (alpha + n * beta) + steps * n * gamma


# Algorithm names match ddp_lab.tools.bench.collectives' (and ddp_lab.collectives').
# "builtin" is the backend's own allreduce (gloo's or NCCL's), a black box here:
# it is modelled, and fitted, with the ring formula, which is what NCCL uses for
# large messages and what gloo's ring variants do. The textbook versions of ring
# and halving-doubling send the same bytes in the same steps as the tuned ones
# (they only also send empty pieces), so they share their formulas.
MODELS: dict[str, Callable[[int, float, float, float, float], float]] = {
    "builtin": ring,
    "naive": naive,
    "ring": ring,
    "halving_doubling": halving_doubling,
    "tree": tree,
    "ring_textbook": ring,
    "halving_doubling_textbook": halving_doubling,
    "direct": direct,
}


# The collectives sharded training is made of (ddp_lab.collectives.ring_textbook's two
# phases), priced apart; their sum is the ring all-reduce.
PHASES: dict[str, Callable[[int, float, float, float, float], float]] = {
    "reduce_scatter": ring_reduce_scatter,
    "all_gather": ring_all_gather,
}


def get_model(name: str) -> Callable:
    if name not in MODELS:
        raise ConfigError(f"unknown algorithm {name!r}; the cost model knows {', '.join(MODELS)}")
    return MODELS[name]


def coefficients(model: Callable, p: int, n: float) -> tuple[float, float, float]:
    """(d t/d alpha, d t/d beta, d t/d gamma): the model is linear, so unit inputs give them."""
    return model(p, n, 1.0, 0.0, 0.0), model(p, n, 0.0, 1.0, 0.0), model(p, n, 0.0, 0.0, 1.0)


@dataclass(frozen=True)
class Params:
    alpha: float  # s per message
    beta: float   # s per byte sent
    gamma: float  # s per byte reduced
    source: str = ""

    def time(self, model: Callable, p: int, n: float) -> float:
        return model(p, n, self.alpha, self.beta, self.gamma)
