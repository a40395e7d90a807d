"""mode=interleaved of ddp_lab.tools.bench.collectives: all-reduces timed against
dist.all_reduce in interleaved rounds, for a tight ratio on a noisy machine
(with collective=reduce_scatter|all_gather, those against torch's own).

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=3 -m ddp_lab.tools.bench.collectives \
        mode=interleaved 'interleaved.sizes=[64K,1M,4M,16M]' interleaved.rounds=15 \
        'algos=[builtin,ring,halving_doubling]'

Each round times every algorithm once (a block of calls on the same buffer,
the slowest rank's time), in a shuffled order, so all algorithms see the same
machine conditions; that matters on a small or shared machine, where
background load moves timings by tens of percent. The order is shuffled
afresh each round (the same on every rank) rather than rotated, since a
rotation puts each algorithm behind the same neighbour in almost every round,
and two names for the same ring plan then read apart by more than shuffled
rounds ever showed (docs/communication.md, "Interleaved timing against
gloo"). Each block starts with `interleaved.warmup`
untimed calls: the first calls after a switch of algorithm can be slower than
the rest (seen there at 4 MiB, where a block is only 2 calls), which would
charge whichever algorithm comes second.

Reported per size and algorithm (printed, and in interleaved.csv): the median
time over rounds, the bus bandwidth it implies (busbw = size / time *
2(n-1)/n, comparable across world sizes), and the median over rounds of the
per-round busbw ratio to builtin (paired, so less sensitive to load drifting
between rounds than the ratio of medians). Each algorithm's first call on a
size is checked against the exact sum (`wrong`, as in the sweep).
reduce_scatter and all_gather use their factor, (n-1)/n (sweep.py), and their
interleaved.csv ends with a column `collective`.
"""
from __future__ import annotations

import csv
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from ddp_lab.config import ConfigError

CSV_COLUMNS = ["algo", "size_bytes", "dtype", "world_size", "rounds", "calls_per_block",
               "time_us", "busbw_gbps", "vs_builtin", "wrong"]
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(value) -> int:
    """Bytes from 4096, "4096", "64K", "1M", "1MiB" or "2G"."""
    text = str(value).strip().upper().removesuffix("IB").removesuffix("B")
    try:
        if text and text[-1] in _UNITS:
            return int(float(text[:-1]) * _UNITS[text[-1]])
        return int(text)
    except ValueError:
        raise ConfigError(f"interleaved.sizes: {value!r} is not a size in bytes; "
                          "e.g. 'interleaved.sizes=[64K,1M,16M]'") from None


def sizes_of(cfg, elem_size: int) -> list[int]:
    """interleaved.sizes, checked: positive multiples of the element size."""
    sizes = [parse_size(v) for v in cfg.interleaved.sizes]
    if not sizes:
        raise ConfigError("interleaved.sizes is empty; e.g. 'interleaved.sizes=[64K,1M,16M]'")
    for s in sizes:
        if s < elem_size or s % elem_size:
            raise ConfigError(f"interleaved.sizes: {s} bytes is not a positive multiple of the "
                              f"{elem_size}-byte element size of dtype={cfg.dtype}")
    return sizes


def time_block(fn: Callable, t: torch.Tensor, calls: int, warmup: int, cuda: bool) -> float:
    """Seconds per call, for the slowest rank, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn(t)
    dist.barrier()
    if cuda:
        torch.cuda.synchronize(t.device)
    start = time.perf_counter()
    for _ in range(calls):
        fn(t)
    if cuda:
        torch.cuda.synchronize(t.device)
    elapsed = torch.tensor([(time.perf_counter() - start) / calls], dtype=torch.float64, device=t.device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item()


def run(cfg, plan, env, fns: dict[str, Callable], run_dir: Path, check: Callable) -> list[dict]:
    """Time `fns` (builtin among them) in shuffled rounds; rows on every rank,
    printed and written to run_dir/interleaved.csv on rank 0.

    check(algo, fn, size) -> the count of wrong elements of a first call."""
    n, rounds = env.world_size, int(cfg.interleaved.rounds)
    factor = plan.busbw_factor(n)  # 2(n-1)/n for all_reduce, (n-1)/n for its halves
    columns = CSV_COLUMNS if plan.collective == "all_reduce" else [*CSV_COLUMNS, "collective"]
    named = "" if plan.collective == "all_reduce" else f"collective={plan.collective} "
    cuda = env.device.type == "cuda"
    rows = []
    if env.is_main:
        print(f"# ddp_lab.tools.bench.collectives mode=interleaved: {named}world_size={n} dtype={plan.dtype_name} "
              f"rounds={rounds} warmup={cfg.interleaved.warmup} comm_threads={env.comm_threads} "
              "(median over rounds; vs_builtin = median of per-round busbw / builtin's)")
        print(f"{'size':>10} {'algo':>26} {'time_us':>10} {'busbw_GB/s':>11} {'vs_builtin':>10} {'wrong':>6}",
              flush=True)
    for size in plan.sizes:
        wrong = {a: check(a, fns[a], size) for a in plan.algos}  # also warms up connections
        t = torch.zeros(size // plan.elem_size, dtype=plan.dtype, device=env.device)
        calls = max(2, min(20, int(cfg.interleaved.block_bytes) // size))
        times: dict[str, list[float]] = {a: [] for a in plan.algos}
        for r in range(rounds):
            order = list(plan.algos)
            random.Random(r).shuffle(order)  # seeded: every rank runs the same order
            for a in order:
                times[a].append(time_block(fns[a], t, calls, int(cfg.interleaved.warmup), cuda))
        for a in plan.algos:
            med = statistics.median(times[a])
            rows.append({
                "algo": a, "size_bytes": size, "dtype": plan.dtype_name, "world_size": n,
                "rounds": rounds, "calls_per_block": calls, "time_us": round(med * 1e6, 2),
                "busbw_gbps": round(size / med * factor / 1e9, 6),
                "vs_builtin": round(statistics.median(b / x for b, x in zip(times["builtin"], times[a])), 4),
                "wrong": wrong[a], "collective": plan.collective,
            })
            if env.is_main:
                r = rows[-1]
                print(f"{size:>10} {a:>26} {r['time_us']:>10.0f} {r['busbw_gbps']:>11.3f} "
                      f"{r['vs_builtin']:>10.2f} {r['wrong']:>6}", flush=True)
    if env.is_main:
        path = run_dir / "interleaved.csv"
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
        print(f"# wrote {path}")
    return rows
