"""The ring's two phases on their own: reduce-scatter and all-gather, in real processes,
against the exact sum and against torch's own collectives."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from ddp_lab.collectives import (
    SUPPORTED_DTYPES,
    own_chunk,
    ring_textbook_all_gather,
    ring_textbook_reduce_scatter,
)
from ddp_lab.collectives.basics import chunk_bounds
from tests.collectives.test_allreduce import UNIT_ROUNDOFF, _compare, _input
from tests.multiproc import run_in_processes

# lengths not divisible by the ranks, fewer elements than ranks, and none
NUMELS = (0, 1, 3, 7, 1021, 100_003)


def _check(rank: int, world_size: int) -> list[str]:
    problems = []
    for case, (numel, dtype) in enumerate((m, d) for m in NUMELS for d in SUPPORTED_DTYPES):
        what = f"numel={numel} {dtype}"
        inputs = [_input(r, (numel,), dtype, case) for r in range(world_size)]
        bounds = chunk_bounds(numel, world_size)
        mine = slice(bounds[rank], bounds[rank + 1])
        # reduce-scatter: this rank's chunk holds the sum, within the rounding bound
        t = inputs[rank].clone()
        out = ring_textbook_reduce_scatter(t)
        exact = sum(x.double() for x in inputs)[mine]
        bound = world_size * UNIT_ROUNDOFF[dtype] * sum(x.double().abs() for x in inputs)[mine]
        if out.data_ptr() != own_chunk(t).data_ptr() or out.numel() != bounds[rank + 1] - bounds[rank]:
            problems.append(f"reduce-scatter {what}: did not return this rank's chunk of the input")
        if why := _compare(f"reduce-scatter {what} vs exact sum", out, exact, bound):
            problems.append(why)
        if numel % world_size == 0 and numel:  # torch's needs equal chunks
            theirs = torch.empty(numel // world_size, dtype=dtype)
            dist.reduce_scatter_tensor(theirs, inputs[rank].clone())
            if why := _compare(f"reduce-scatter {what} vs torch's", out, theirs.double(), 2 * bound):
                problems.append(why)
        # all-gather: every chunk, from the rank that owns it, bit for bit
        t = torch.full((numel,), float("nan"), dtype=dtype)
        t[mine] = inputs[rank][mine]
        expected = torch.cat([inputs[r][bounds[r]:bounds[r + 1]] for r in range(world_size)])
        if ring_textbook_all_gather(t) is not t or not torch.equal(t, expected):
            problems.append(f"all-gather {what}: not every rank's chunk in place")
    return problems


@pytest.mark.parametrize("world_size", [2, 3, 4, 5])
def test_reduce_scatter_and_all_gather(world_size):
    assert run_in_processes(_check, world_size) == [[]] * world_size
