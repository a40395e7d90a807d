"""What a collectives sweep will run, checked before any collective: the sizes,
algorithms and dtype (`validate`, the same verdict on every rank), and the
bandwidth formulas of nccl-tests (doc/PERFORMANCE.md there) that its rows use."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from ddp_lab.config import ConfigError
from ddp_lab.config.schema import check
from ddp_lab.tools.bench.collectives import interleaved
from ddp_lab.tools.bench.collectives.config import BenchCollectivesConfig

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


# ----------------------------------------------------------------- formulas
def algbw_gbps(size_bytes: float, time_us: float) -> float:
    """Algorithm bandwidth: bytes of the message over the time of one call, GB/s."""
    return size_bytes / (time_us * 1e-6) / 1e9


def busbw_factor(world_size: int) -> float:
    """nccl-tests' allreduce factor 2(n-1)/n: the bytes each rank must send per byte."""
    return 2.0 * (world_size - 1) / world_size


def busbw_gbps(algbw: float, world_size: int) -> float:
    return algbw * busbw_factor(world_size)


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


def validate(cfg: DictConfig) -> Plan:
    """Check the whole config before any collective; same verdict on every rank.

    The schema (config.py) has refused wrong types, unknown choices and
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
    if cfg.mode == "interleaved":  # ratios to builtin: it always runs
        return Plan("interleaved", interleaved.sizes_of(cfg, elem), list(dict.fromkeys(["builtin", *algos])),
                    dtype_name, DTYPES[dtype_name], elem)
    return Plan("sweep", message_sizes(min_b, max_b, cfg.factor), algos, dtype_name, DTYPES[dtype_name], elem)
