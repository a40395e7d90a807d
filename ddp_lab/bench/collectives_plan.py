"""What a collectives sweep will run, checked before any collective: the sizes,
algorithms and dtype (`validate`, the same verdict on every rank), and the
bandwidth formulas of nccl-tests (doc/PERFORMANCE.md there) that its rows use."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from omegaconf import DictConfig, OmegaConf

from ddp_lab.bench import collectives_interleaved as interleaved
from ddp_lab.config import ConfigError

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


def _int_key(cfg, key: str, minimum: int, hint: str) -> int:
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or float(value) != int(value):
        raise ConfigError(f"{key}={value!r} must be an integer; {hint}")
    if int(value) < minimum:
        raise ConfigError(f"{key}={value!r} must be >= {minimum}; {hint}")
    return int(value)


def known_algorithms() -> list[str]:
    from ddp_lab.collectives import ALGORITHMS

    return list(ALGORITHMS)


def validate(cfg: DictConfig, known_algos: list[str] | None = None) -> Plan:
    """Check the whole config before any collective; same verdict on every rank.

    Raises ConfigError naming the key and the fix.
    """
    known = known_algorithms() if known_algos is None else list(known_algos)
    dtype_name = str(cfg.dtype)
    if dtype_name not in DTYPES:
        raise ConfigError(f"dtype={dtype_name!r} is not one of {', '.join(DTYPES)}; e.g. dtype=float32")
    elem = torch.empty((), dtype=DTYPES[dtype_name]).element_size()
    min_b = _int_key(cfg, "min_bytes", 1, "e.g. min_bytes=4096")
    max_b = _int_key(cfg, "max_bytes", 1, "e.g. max_bytes=67108864 (64 MiB)")
    if min_b > max_b:
        raise ConfigError(f"min_bytes={min_b} is larger than max_bytes={max_b}; "
                          "swap them or raise max_bytes")
    factor = cfg.factor
    if (isinstance(factor, bool) or not isinstance(factor, (int, float))
            or float(factor) != int(factor) or int(factor) < 2):
        raise ConfigError(f"factor={factor!r} must be an integer >= 2 (the size multiplier "
                          "between steps, nccl-tests' -f); e.g. factor=2")
    for key, value in (("min_bytes", min_b), ("max_bytes", max_b)):
        if value % elem:
            raise ConfigError(
                f"{key}={value} is not a multiple of the {elem}-byte element size of "
                f"dtype={dtype_name}; use a multiple of {elem}, e.g. {key}={max(elem, value - value % elem)}")
    _int_key(cfg, "warmup", 0, "e.g. warmup=5")
    iters = _int_key(cfg, "iters", 1, "e.g. iters=50")
    min_iters = _int_key(cfg, "min_iters", 1, "e.g. min_iters=3")
    if min_iters > iters:
        raise ConfigError(f"min_iters={min_iters} is larger than iters={iters}; lower min_iters or raise iters")
    budget = cfg.time_budget_s
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget <= 0:
        raise ConfigError(f"time_budget_s={budget!r} must be a positive number of seconds; e.g. time_budget_s=0.5")
    algos = list(cfg.algos) if OmegaConf.is_list(cfg.algos) else [cfg.algos]
    if not algos:
        raise ConfigError(f"algos is empty; name at least one of {', '.join(known)}")
    for a in algos:
        if a not in known:
            raise ConfigError(f"algos: unknown algorithm {a!r}; choose from {', '.join(known)}, "
                              f"e.g. 'algos=[builtin,ring]'")
    algos = list(dict.fromkeys(algos))  # drop repeats, keep order
    if cfg.mode == "interleaved":  # ratios to builtin: it always runs
        return Plan("interleaved", interleaved.sizes_of(cfg, elem), list(dict.fromkeys(["builtin", *algos])),
                    dtype_name, DTYPES[dtype_name], elem)
    if cfg.mode != "sweep":
        raise ConfigError(f"mode={cfg.mode!r} is not one of sweep, interleaved")
    return Plan("sweep", message_sizes(min_b, max_b, int(factor)), algos, dtype_name, DTYPES[dtype_name], elem)
