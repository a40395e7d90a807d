"""The ring's and the direct algorithm's two phases on their own: reduce-scatter and
all-gather, in real processes, against the exact sum and against torch's own collectives."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from ddp_lab.collectives import (
    SUPPORTED_DTYPES,
    direct_all_gather,
    direct_reduce_scatter,
    own_chunk,
    ring_textbook_all_gather,
    ring_textbook_reduce_scatter,
)
from ddp_lab.collectives.basics import chunk_bounds
from tests.helpers.collectives import UNIT_ROUNDOFF, compare, rank_input
from tests.multiproc import run_in_processes

# lengths not divisible by the ranks, fewer elements than ranks, and none
NUMELS = (0, 1, 3, 7, 1021, 100_003)


def _direct_async_rs(t):
    pending = direct_reduce_scatter(t, async_op=True)
    out = pending.wait()
    return out if pending.wait() is out else None  # a second wait returns the same


def _direct_async_ag(t):
    return direct_all_gather(t, async_op=True).wait()


PHASES = {"ring_textbook": (ring_textbook_reduce_scatter, ring_textbook_all_gather),
          "direct": (direct_reduce_scatter, direct_all_gather),
          "direct, async": (_direct_async_rs, _direct_async_ag)}


def _check(rank: int, world_size: int, algo: str) -> list[str]:
    reduce_scatter, all_gather = PHASES[algo]
    problems = []
    for case, (numel, dtype) in enumerate((m, d) for m in NUMELS for d in SUPPORTED_DTYPES):
        what = f"numel={numel} {dtype}"
        inputs = [rank_input(r, (numel,), dtype, case) for r in range(world_size)]
        bounds = chunk_bounds(numel, world_size)
        mine = slice(bounds[rank], bounds[rank + 1])
        # reduce-scatter: this rank's chunk holds the sum, within the rounding bound
        t = inputs[rank].clone()
        out = reduce_scatter(t)
        exact = sum(x.double() for x in inputs)[mine]
        bound = world_size * UNIT_ROUNDOFF[dtype] * sum(x.double().abs() for x in inputs)[mine]
        if out.data_ptr() != own_chunk(t).data_ptr() or out.numel() != bounds[rank + 1] - bounds[rank]:
            problems.append(f"reduce-scatter {what}: did not return this rank's chunk of the input")
        if why := compare(f"reduce-scatter {what} vs exact sum", out, exact, bound):
            problems.append(why)
        if numel % world_size == 0 and numel:  # torch's needs equal chunks
            theirs = torch.empty(numel // world_size, dtype=dtype)
            dist.reduce_scatter_tensor(theirs, inputs[rank].clone())
            if why := compare(f"reduce-scatter {what} vs torch's", out, theirs.double(), 2 * bound):
                problems.append(why)
        # all-gather: every chunk, from the rank that owns it, bit for bit
        t = torch.full((numel,), float("nan"), dtype=dtype)
        t[mine] = inputs[rank][mine]
        expected = torch.cat([inputs[r][bounds[r]:bounds[r + 1]] for r in range(world_size)])
        if all_gather(t) is not t or not torch.equal(t, expected):
            problems.append(f"all-gather {what}: not every rank's chunk in place")
    return problems


@pytest.mark.parametrize("algo", list(PHASES))
@pytest.mark.parametrize("world_size", [2, 3, 4, 5])
def test_reduce_scatter_and_all_gather(world_size, algo):
    assert run_in_processes(_check, world_size, algo) == [[]] * world_size


def _overlapped(rank: int, world_size: int) -> list[str]:
    """Several direct reduce-scatters and all-gathers in flight at once, waited for in order
    (as zero stage 2 posts its buckets), each landing where it belongs."""
    bufs = [torch.arange(1000.0 * (k + 1)) * (rank + 1) for k in range(3)]
    rs = [direct_reduce_scatter(b, async_op=True) for b in bufs]
    problems = []
    for k, (b, pending) in enumerate(zip(bufs, rs)):
        bounds = chunk_bounds(b.numel(), world_size)
        want = torch.arange(1000.0 * (k + 1))[bounds[rank]:bounds[rank + 1]] * sum(range(1, world_size + 1))
        if not torch.equal(pending.wait(), want):
            problems.append(f"reduce-scatter {k} in flight with others: wrong sum")
    gathers = [torch.full((999 * (k + 1),), float(rank)) for k in range(3)]
    ag = [direct_all_gather(g, async_op=True) for g in gathers]
    for k, (g, pending) in enumerate(zip(gathers, ag)):
        bounds = chunk_bounds(g.numel(), world_size)
        want = torch.cat([torch.full((bounds[r + 1] - bounds[r],), float(r)) for r in range(world_size)])
        if pending.wait() is not g or not torch.equal(g, want):
            problems.append(f"all-gather {k} in flight with others: wrong chunks")
    return problems


@pytest.mark.parametrize("world_size", [2, 4])
def test_direct_phases_in_flight_together(world_size):
    assert run_in_processes(_overlapped, world_size) == [[]] * world_size
