"""The point-to-point all-reduces agree with dist.all_reduce, in real processes.

Spawning is the slow part, so each world size starts its processes once and
loops over every algorithm, size and dtype inside (`_check_world`). Each rank
returns the problems it found plus a fingerprint of every result, and the
test asserts there are no problems and that all ranks hold identical results.
"""
from __future__ import annotations

import hashlib

import pytest
import torch
import torch.distributed as dist

from ddp_lab import collectives
from ddp_lab.collectives import (
    ALGORITHMS,
    SUPPORTED_DTYPES,
    TunedPlan,
    get_algorithm,
)
from ddp_lab.collectives.tuned import p2p
from tests.helpers.collectives import UNIT_ROUNDOFF, compare, rank_input
from tests.multiproc import run_in_processes

BIG = 1_000_003  # ~4 MB of float32, odd length; above the size where pairwise
#                  exchanges switch to send-first at normal priority
#                  (pairwise.EARLY_RECV_MAX_BYTES)


def _cases(world_size: int) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """(shape, dtype) pairs: empty, tiny, fewer elements than ranks, primes, big."""
    numels = sorted({0, 1, max(world_size - 1, 0), 7, 1021})
    shapes = [(m,) for m in numels] + [(), (3, 341)]
    cases = [(shape, dtype) for shape in shapes for dtype in SUPPORTED_DTYPES]
    cases.append(((BIG,), torch.float32))
    return cases


def _fingerprint(t: torch.Tensor) -> str:
    return hashlib.sha1(t.reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def _check_sum(rank, ranks, cases, group=None, label=""):
    """Run every algorithm on every case over `group`; return (problems, fingerprints)."""
    problems, prints = [], []
    for case, (shape, dtype) in enumerate(cases):
        inputs = [rank_input(r, shape, dtype, case) for r in ranks]
        exact = sum(x.double() for x in inputs)
        bound = len(ranks) * UNIT_ROUNDOFF[dtype] * sum(x.double().abs() for x in inputs)
        mine = inputs[ranks.index(rank)]
        reference = mine.clone()
        dist.all_reduce(reference, group=group)
        for name, fn in ALGORITHMS.items():
            what = f"{label}{name} shape={shape} {dtype}"
            t = mine.clone()
            out = fn(t, group)
            if out is not t:
                problems.append(f"{what}: did not return the input tensor")
            if t.shape != torch.Size(shape) or t.dtype != dtype:
                problems.append(f"{what}: shape/dtype changed to {tuple(t.shape)} {t.dtype}")
                continue
            # Both we and dist.all_reduce are within `bound` of the exact sum.
            for why in (compare(what + " vs exact sum", t, exact, bound),
                        compare(what + " vs dist.all_reduce", t, reference.double(), 2 * bound)):
                if why:
                    problems.append(why)
            prints.append(f"{what}: {_fingerprint(t)}")
    return problems, prints


def _sum_problem(what, fn, rank, world_size, numel, dtype, case) -> str | None:
    """fn on this rank's input of `case`, against the exact sum: None if right."""
    inputs = [rank_input(r, (numel,), dtype, case) for r in range(world_size)]
    exact = sum(x.double() for x in inputs)
    bound = world_size * UNIT_ROUNDOFF[dtype] * sum(x.double().abs() for x in inputs)
    return compare(what, fn(inputs[rank].clone()), exact, bound)


def _check_ring_segments(rank: int, world_size: int) -> list[str]:
    """The ring with many segments per chunk, under the plans for gloo's
    threads at normal and at real-time priority and for ranks on several
    hosts, handed in by argument, and a
    scratch cap that forces slot reuse."""
    problems = []
    # (elements, dtype, segment bytes, scratch cap bytes); a cap of 1 byte
    # gives the minimum number of scratch slots.
    configs = [(1021, torch.float64, 1024, 1 << 30), (1021, torch.float64, 1024, 1),
               (20_011, torch.bfloat16, 4096, 16 * 1024), (BIG, torch.float32, 512 * 1024, 1 << 20),
               (400_003, torch.float32, None, 1 << 30)]  # across hosts: chunks of ~530-800 KiB cut in two
    for realtime, across in ((False, False), (True, False), (False, True), (True, True)):
        for case, (numel, dtype, seg_bytes, cap) in enumerate(configs):
            plan = TunedPlan(realtime_threads=realtime, across_hosts=across, segment_bytes=seg_bytes,
                             max_scratch_bytes=cap)
            why = _sum_problem(f"ring {plan} numel={numel} {dtype}",
                               get_algorithm("ring", plan), rank, world_size, numel, dtype, 100 + case)
            if why:
                problems.append(why)
    return problems


def _check_pairwise_plans(rank: int, world_size: int) -> list[str]:
    """Naive and halving-doubling under both receive orders (pairwise.receives_first
    follows the plan): receives first at every size with real-time threads,
    send-first above EARLY_RECV_MAX_BYTES otherwise."""
    problems = []
    for plan in (TunedPlan(realtime_threads=False), TunedPlan(realtime_threads=True),
                 TunedPlan(across_hosts=True)):
        for case, (numel, dtype) in enumerate([(7, torch.bfloat16), (1021, torch.float64),
                                               (BIG, torch.float32)]):
            for name in ("naive", "halving_doubling"):
                why = _sum_problem(f"{name} {plan} numel={numel} {dtype}",
                                   get_algorithm(name, plan), rank, world_size, numel, dtype, 200 + case)
                if why:
                    problems.append(why)
    return problems


def _check_repeated_calls(rank: int, world_size: int) -> list[str]:
    """The ring and halving-doubling keep what they worked out for a buffer
    (p2p.prepared): the same buffer with new contents, views at other offsets
    of one storage, and more buffers than are kept, in turn, must all still
    sum right."""
    problems = []
    base = torch.zeros(3 * 1021)
    buffers = [base[:1021], base[1021:2042], base[2042:]]  # one storage, three addresses
    buffers += [torch.zeros(1021) for _ in range(p2p.PREPARED_CALLS_KEPT)]
    for name in ("ring", "halving_doubling"):
        collectives.free_scratch_buffers()
        for call, index in enumerate([0, 0, 1, 0, 2, *range(3, len(buffers)), 0, 1]):
            inputs = [rank_input(r, (1021,), torch.float64, 500 + call) for r in range(world_size)]
            t = buffers[index]
            t.copy_(inputs[rank])
            ALGORITHMS[name](t)
            why = compare(f"{name} call {call} on buffer {index}", t, sum(inputs), torch.zeros(1021))
            if why:
                problems.append(why)
        kept = p2p.per_thread.__dict__.get("prepared", {})
        if world_size > 1 and len(kept) != p2p.PREPARED_CALLS_KEPT:
            problems.append(f"{name}: {len(kept)} prepared calls kept, expected {p2p.PREPARED_CALLS_KEPT}")
        # Another plan on the same buffer is prepared anew, not taken from the one kept.
        collectives.free_scratch_buffers()
        for plan in (TunedPlan(), TunedPlan(realtime_threads=True), TunedPlan()):
            inputs = [rank_input(r, (1021,), torch.float64, 600) for r in range(world_size)]
            buffers[0].copy_(inputs[rank])
            get_algorithm(name, plan)(buffers[0])
            why = compare(f"{name} {plan}", buffers[0], sum(inputs), torch.zeros(1021))
            if why:
                problems.append(why)
        kept = p2p.per_thread.__dict__.get("prepared", {})
        if world_size > 1 and sorted(key[-1].realtime_threads for key in kept) != [False, True]:
            problems.append(f"{name}: prepared calls kept for {[key[-1] for key in kept]}")
    return problems


def _check_world(rank: int, world_size: int):
    """Every algorithm on every case over the default group; on 4 ranks, subgroups too."""
    ranks = list(range(world_size))
    problems, prints = _check_sum(rank, ranks, _cases(world_size))
    problems += _check_ring_segments(rank, world_size)
    problems += _check_pairwise_plans(rank, world_size)
    problems += _check_repeated_calls(rank, world_size)
    if world_size == 4:
        # new_group is collective: every rank creates every group.
        for members in ([1, 3], [0, 2, 3]):
            group = dist.new_group(members)
            if rank in members:
                p, f = _check_sum(rank, members, _cases(len(members))[:12], group,
                                  label=f"group {members}: ")
                problems += p
                prints += f
            else:
                for name in [n for n in ALGORITHMS if n != "builtin"]:
                    try:
                        ALGORITHMS[name](torch.ones(3), group)
                        problems.append(f"{name} on group {members} from rank {rank}: no error")
                    except ValueError as e:
                        if "not a member" not in str(e):
                            problems.append(f"{name} on group {members} from rank {rank}: {e}")
    return problems, prints


# 5 ranks (4 + a remainder of 1, as 3 is 2 + 1) on the system run: 7 s on 2 cores
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, pytest.param(5, marks=pytest.mark.system)])
def test_every_algorithm_matches_all_reduce(world_size):
    results = run_in_processes(_check_world, world_size, timeout=240)
    problems = [p for rank_problems, _ in results for p in rank_problems]
    assert problems == [], "\n".join(problems[:40])
    # Every rank must end with bit-identical results (the ring and halving-
    # doubling broadcast each reduced chunk from a single owner).
    def lines(rank, prefix):
        return [line for line in results[rank][1] if line.startswith(prefix)]

    default = [[line for line in r[1] if not line.startswith("group")] for r in results]
    assert all(d == default[0] for d in default)
    assert len(default[0]) == len(_cases(world_size)) * len(ALGORITHMS)
    if world_size == 4:
        for members in ([1, 3], [0, 2, 3]):
            prefix = f"group {members}: "
            sub = [lines(r, prefix) for r in members]
            assert sub[0] and all(s == sub[0] for s in sub)


def _cuda_on_gloo(rank: int, world_size: int):
    problems = []
    for case, numel in enumerate([0, 1, 7, 1021, 100_003]):
        inputs = [rank_input(r, (numel,), torch.float64, case) for r in range(world_size)]
        exact = sum(inputs)
        for name, fn in ALGORITHMS.items():
            t = inputs[rank].to("cuda:0")
            out = fn(t)
            if out is not t or not out.is_cuda or not torch.equal(out.cpu(), exact):
                problems.append(f"{name} numel={numel}")
    return problems


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_on_gloo_are_staged_through_the_host():
    results = run_in_processes(_cuda_on_gloo, 2)
    assert results == [[], []]


def _on_nccl(rank: int, world_size: int):
    problems = []
    device = torch.device("cuda", torch.cuda.current_device())
    for case, numel in enumerate([0, 1, world_size - 1, 7, 1021, 100_003]):
        inputs = [rank_input(r, (numel,), torch.float64, case) for r in range(world_size)]
        exact = sum(inputs)
        for name, fn in ALGORITHMS.items():
            t = inputs[rank].to(device)
            out = fn(t)
            torch.cuda.synchronize()
            if out is not t or not torch.equal(out.cpu(), exact):
                problems.append(f"{name} numel={numel}")
    return problems


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices for NCCL")
def test_cuda_tensors_on_nccl():
    world_size = min(torch.cuda.device_count(), 3)
    results = run_in_processes(_on_nccl, world_size, backend="nccl")
    assert results == [[]] * world_size
