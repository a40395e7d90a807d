"""The correctness check of a collectives sweep, nccl-tests' #wrong: every rank
fills its buffer with an integer pattern whose sum over ranks is exact in the
dtype, so any summation order must give exactly the expected sum."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from ddp_lab.distributed import DistEnv
from ddp_lab.tools.bench.collectives.plan import DTYPES, Plan

# Largest n such that every integer in [-n, n] is exact in the type: the check
# pattern and all its partial sums stay inside, so any summation order is exact.
_EXACT_INT = {"float32": 2 ** 24, "float64": 2 ** 53, "bfloat16": 2 ** 8, "float16": 2 ** 11}


def pattern_bound(dtype_name: str, world_size: int) -> int:
    """K such that values in [-K, K] and all sums of up to world_size of them are exact."""
    return max(1, min(2 ** 20, _EXACT_INT[dtype_name] // world_size))


def fill_pattern(buf: torch.Tensor, rank: int, world_size: int, dtype_name: str) -> None:
    """Element i of rank r: ((i + 7919 r) mod (2K+1)) - K, an integer in [-K, K]."""
    buf.copy_(_pattern_int(buf.numel(), rank, world_size, dtype_name, buf.device))


def _pattern_int(count: int, rank: int, world_size: int, dtype_name: str,
                 device: torch.device) -> torch.Tensor:
    k = pattern_bound(dtype_name, world_size)
    i = torch.arange(count, dtype=torch.int64, device=device)
    return torch.remainder(i + 7919 * rank, 2 * k + 1) - k


def count_wrong(fn: Callable, size: int, env: DistEnv, cfg: DictConfig, plan: Plan) -> int:
    """One call of fn on the check pattern: the elements, over all ranks, that
    differ from the exact sum (-1 with check=false)."""
    buf = torch.empty(size // plan.elem_size, dtype=plan.dtype, device=env.device)
    fill_pattern(buf, env.rank, env.world_size, plan.dtype_name)
    fn(buf)
    if not cfg.check:
        return -1
    want = expected_sum(buf.numel(), env.world_size, plan.dtype_name, env.device)
    wrong = torch.tensor([int((buf != want).sum().item())], dtype=torch.float64, device=env.device)
    dist.all_reduce(wrong)
    return int(wrong.item())


def expected_sum(count: int, world_size: int, dtype_name: str, device: torch.device) -> torch.Tensor:
    """The exact elementwise sum of every rank's pattern (computed in int64)."""
    total = torch.zeros(count, dtype=torch.int64, device=device)
    for r in range(world_size):
        total += _pattern_int(count, r, world_size, dtype_name, device)
    return total.to(DTYPES[dtype_name])
