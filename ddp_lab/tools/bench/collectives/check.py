"""The correctness check of a collectives sweep, nccl-tests' #wrong: every rank
fills its buffer with an integer pattern whose sum over ranks is exact in the
dtype, so any summation order must give exactly the expected sum.

all_reduce checks the whole buffer against the sum; reduce_scatter this rank's
chunk against the sum's same chunk; all_gather the whole buffer against every
rank's own chunk of its pattern (its other chunks start as NaN, which equals
nothing, so a chunk that never arrived counts as wrong)."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from ddp_lab.distributed import DistEnv
from ddp_lab.tools.bench.collectives.sweep_plan import DTYPES, Plan

# Largest n such that every integer in [-n, n] is exact in the type: the check
# pattern and all its partial sums stay inside, so any summation order is exact.
_EXACT_INT = {"float32": 2 ** 24, "float64": 2 ** 53, "bfloat16": 2 ** 8, "float16": 2 ** 11}


def pattern_bound(dtype_name: str, world_size: int) -> int:
    """K such that values in [-K, K] and all sums of up to world_size of them are exact."""
    return max(1, min(2 ** 20, _EXACT_INT[dtype_name] // world_size))


def fill_pattern(buf: torch.Tensor, rank: int, world_size: int, dtype_name: str) -> None:
    """Element i of rank r: ((i + 7919 r) mod (2K+1)) - K, an integer in [-K, K]."""
    buf.copy_(_pattern_int(buf.numel(), rank, world_size, dtype_name, buf.device))


def _pattern_int(count: int, rank: int | torch.Tensor, world_size: int, dtype_name: str,
                 device: torch.device) -> torch.Tensor:
    k = pattern_bound(dtype_name, world_size)
    i = torch.arange(count, dtype=torch.int64, device=device)
    return torch.remainder(i + 7919 * rank, 2 * k + 1) - k


def _chunk(count: int, rank: int, world_size: int) -> slice:
    """Rank `rank`'s chunk of a buffer of `count` elements (count divides by world_size)."""
    c = count // world_size
    return slice(rank * c, (rank + 1) * c)


def fill_input(buf: torch.Tensor, collective: str, rank: int, world_size: int, dtype_name: str) -> None:
    """This rank's input: the pattern over the whole buffer (all_gather: over its own chunk, NaN elsewhere)."""
    fill_pattern(buf, rank, world_size, dtype_name)
    if collective == "all_gather":
        own = _chunk(buf.numel(), rank, world_size)
        buf[:own.start].fill_(float("nan"))
        buf[own.stop:].fill_(float("nan"))


def expected(collective: str, count: int, rank: int, world_size: int, dtype_name: str,
             device: torch.device) -> torch.Tensor:
    """What this rank must hold after the collective, exactly: the whole sum (all_reduce),
    its chunk of the sum (reduce_scatter), every rank's chunk of its own pattern (all_gather)."""
    if collective == "all_reduce":
        return expected_sum(count, world_size, dtype_name, device)
    if collective == "reduce_scatter":
        return expected_sum(count, world_size, dtype_name, device)[_chunk(count, rank, world_size)].clone()
    owner = torch.arange(count, dtype=torch.int64, device=device) // (count // world_size)
    return _pattern_int(count, owner, world_size, dtype_name, device).to(DTYPES[dtype_name])


def result_of(collective: str, buf: torch.Tensor, returned: torch.Tensor) -> torch.Tensor:
    """What the check compares: the chunk a reduce-scatter returned, else the whole buffer."""
    return returned if collective == "reduce_scatter" else buf


def count_wrong(fn: Callable, size: int, env: DistEnv, cfg: DictConfig, plan: Plan) -> int:
    """One call of fn on the check pattern: the elements, over all ranks, that
    differ from the exact result (-1 with check=false)."""
    buf = torch.empty(size // plan.elem_size, dtype=plan.dtype, device=env.device)
    fill_input(buf, plan.collective, env.rank, env.world_size, plan.dtype_name)
    got = result_of(plan.collective, buf, fn(buf))
    if not cfg.check:
        return -1
    return wrong_elements(got, buf.numel(), env, plan)


def wrong_elements(got: torch.Tensor, count: int, env: DistEnv, plan: Plan) -> int:
    """The elements of `got`, summed over all ranks, that differ from what
    `expected` says this rank must hold after the collective on `count` elements."""
    want = expected(plan.collective, count, env.rank, env.world_size, plan.dtype_name, env.device)
    wrong = torch.tensor([int((got != want).sum().item())], dtype=torch.float64, device=env.device)
    dist.all_reduce(wrong)
    return int(wrong.item())


def expected_sum(count: int, world_size: int, dtype_name: str, device: torch.device) -> torch.Tensor:
    """The exact elementwise sum of every rank's pattern (computed in int64)."""
    total = torch.zeros(count, dtype=torch.int64, device=device)
    for r in range(world_size):
        total += _pattern_int(count, r, world_size, dtype_name, device)
    return total.to(DTYPES[dtype_name])
