"""What a collectives sweep will run, checked before any collective: the
collective, sizes, algorithms and dtype (`validate`, the same verdict on every
rank; `chunked_sizes` once the world size is known), and the bandwidth formulas
of nccl-tests (doc/PERFORMANCE.md there) that its rows use."""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from omegaconf import DictConfig

from ddp_lab.config import ConfigError
from ddp_lab.config.schema import check
from ddp_lab.tools.bench.collectives import interleaved
from ddp_lab.tools.bench.collectives.bench_config import BenchCollectivesConfig

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
# The algorithms each collective other than all_reduce has (all_reduce: every
# one of ddp_lab.collectives.ALGORITHMS): torch's own, the textbook ring's phase, the direct one's.
COLLECTIVE_ALGOS = {
    "reduce_scatter": ("builtin", "ring_textbook", "direct"),
    "all_gather": ("builtin", "ring_textbook", "direct"),
}


# ----------------------------------------------------------------- formulas
def algbw_gbps(size_bytes: float, time_us: float) -> float:
    """Algorithm bandwidth: bytes of the message over the time of one call, GB/s."""
    return size_bytes / (time_us * 1e-6) / 1e9


def busbw_factor(world_size: int, collective: str = "all_reduce") -> float:
    """nccl-tests' factor, the bytes each rank must send per byte of the whole buffer:
    2(n-1)/n for all_reduce, (n-1)/n for reduce_scatter and all_gather (each is
    one of all-reduce's two halves)."""
    sends = 2.0 if collective == "all_reduce" else 1.0
    return sends * (world_size - 1) / world_size


def busbw_gbps(algbw: float, world_size: int, collective: str = "all_reduce") -> float:
    return algbw * busbw_factor(world_size, collective)


def message_sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """min_bytes, min_bytes*factor, ... up to and including max_bytes (as nccl-tests)."""
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s *= factor
    return sizes


# --------------------------------------------------------------- validation
@dataclass(frozen=True)
class Plan:
    mode: str  # sweep | interleaved
    sizes: list[int]
    algos: list[str]
    dtype_name: str
    dtype: torch.dtype
    elem_size: int
    collective: str = "all_reduce"

    def busbw_factor(self, world_size: int) -> float:
        return busbw_factor(world_size, self.collective)


def chunked_sizes(sizes: list[int], world_size: int, elem_size: int, collective: str) -> tuple[list[int], str]:
    """The sizes reduce_scatter and all_gather run: each rounded down to a multiple of
    world_size x elem_size, so every rank's chunk is whole and the same (nccl-tests'
    count per rank); a size that rounds to 0 or repeats an earlier one is skipped.
    Returns the sizes and a line saying what changed ("" when nothing did)."""
    unit = world_size * elem_size
    if collective == "all_reduce" or world_size == 1:
        return list(sizes), ""
    kept, changes = [], []
    for s in sizes:
        r = s - s % unit
        if r == 0 or r in kept:
            changes.append(f"{s} skipped" if r == 0 else f"{s} -> {r} (a repeat) skipped")
        else:
            kept.append(r)
            if r != s:
                changes.append(f"{s} -> {r}")
    if not kept:
        raise ConfigError(f"collective={collective} at world_size {world_size} needs sizes of at least {unit} "
                          f"bytes (one {elem_size}-byte element per rank), and every size asked for is smaller; "
                          "raise max_bytes (mode=interleaved: interleaved.sizes)")
    note = (f"sizes rounded down to a multiple of world_size {world_size} x {elem_size} B = {unit} B: "
            + ", ".join(changes)) if changes else ""
    return kept, note


def _default_algos() -> list[str]:
    (f,) = (f for f in fields(BenchCollectivesConfig) if f.name == "algos")
    return [str(a) for a in f.default_factory()]


def validate(cfg: DictConfig) -> Plan:
    """Check the whole config before any collective; same verdict on every rank.

    The schema (bench_config.py) has refused wrong types, unknown choices and
    values out of range; what is left depends on two keys at once.
    Raises ConfigError naming the key and the fix.
    """
    check(cfg, BenchCollectivesConfig)
    dtype_name = str(cfg.dtype)
    elem = torch.empty((), dtype=DTYPES[dtype_name]).element_size()
    min_b, max_b = cfg.min_bytes, cfg.max_bytes
    if min_b > max_b:
        raise ConfigError(f"min_bytes={min_b} is larger than max_bytes={max_b}; "
                          "swap them or raise max_bytes")
    for key, value in (("min_bytes", min_b), ("max_bytes", max_b)):
        if value % elem:
            raise ConfigError(
                f"{key}={value} is not a multiple of the {elem}-byte element size of "
                f"dtype={dtype_name}; use a multiple of {elem}, e.g. {key}={max(elem, value - value % elem)}")
    if cfg.min_iters > cfg.iters:
        raise ConfigError(f"min_iters={cfg.min_iters} is larger than iters={cfg.iters}; "
                          "lower min_iters or raise iters")
    algos = list(dict.fromkeys(str(a) for a in cfg.algos))  # drop repeats, keep order
    collective = str(cfg.collective)
    if collective in COLLECTIVE_ALGOS:
        have = COLLECTIVE_ALGOS[collective]
        if [str(a) for a in cfg.algos] == _default_algos():  # not asked for: the ones it has
            algos = list(have)
        missing = [a for a in algos if a not in have]
        if missing:
            raise ConfigError(
                f"algos: {', '.join(missing)} {'has' if len(missing) == 1 else 'have'} no "
                f"{collective.replace('_', '-')} (collective={collective}); choose among "
                f"{', '.join(have)}, e.g. 'algos=[{','.join(have)}]'")
    if cfg.mode == "interleaved":  # ratios to builtin: it always runs
        return Plan("interleaved", interleaved.sizes_of(cfg, elem), list(dict.fromkeys(["builtin", *algos])),
                    dtype_name, DTYPES[dtype_name], elem, collective)
    return Plan("sweep", message_sizes(min_b, max_b, cfg.factor), algos, dtype_name, DTYPES[dtype_name], elem,
                collective)
