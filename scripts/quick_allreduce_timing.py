"""Quick, interleaved timing of ddp_lab's all-reduces against dist.all_reduce.

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=3 \
        scripts/quick_allreduce_timing.py --sizes 64K,1M,4M,16M --rounds 15

Each round times every algorithm once (a block of calls on the same buffer,
slowest rank's time), in a shuffled order, so all algorithms see the same
machine conditions; that matters on a small or shared machine, where
background load moves timings by tens of percent. The order is shuffled
afresh each round (the same on every rank) rather than rotated, since a
rotation puts each algorithm behind the same neighbour in almost every
round. On the 2-core development machine, two names for the same ring plan
in one rotated launch came out at 0.86 and 1.02 of gloo (2 MiB, 3 ranks);
in shuffled rounds two such copies differed by 0.02 in the median and 0.08
at most (28 pairs: 1-16 MiB, 3 and 4 ranks). Each block starts with
`--warmup` untimed calls: the first calls after a switch of algorithm can
be slower than the rest (seen on the 2-core test machine at 4 MiB, where a
block is only 2 calls), which would charge whichever algorithm comes second. Reported per size and
algorithm: the median time over rounds, the bus bandwidth it implies
(busbw = size / time * 2(n-1)/n, the per-link traffic of a bandwidth-optimal
all-reduce, comparable across world sizes), and the median over rounds of
the per-round busbw ratio to "builtin" (paired, so less sensitive to load
drifting between rounds than the ratio of medians).

For full sweeps with CSV output and plots, see ddp_lab.bench.collectives.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
import torch.distributed as dist

from ddp_lab.collectives import ALGORITHMS, get_algorithm
from ddp_lab.distributed import COMM_THREADS, setup


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def time_block(fn, t: torch.Tensor, iters: int, warmup: int = 0) -> float:
    """Seconds per call, for the slowest rank, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn(t)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn(t)
    elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="64K,1M,4M,16M", help="message sizes in bytes (K/M/G suffixes)")
    parser.add_argument("--algos", default="builtin,ring,halving_doubling",
                        help=f"comma list of {', '.join(ALGORITHMS)}")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16", "float16"])
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls before each timed block")
    parser.add_argument("--budget-bytes", type=float, default=8e6,
                        help="bytes per timed block: iterations = budget / size, clamped to [2, 20]")
    parser.add_argument("--comm-threads", default="auto", choices=COMM_THREADS,
                        help="gloo's threads at real-time priority where permitted, as dist.comm_threads")
    args = parser.parse_args()

    algos = args.algos.split(",")
    if "builtin" not in algos:
        algos.insert(0, "builtin")
    env = setup("gloo", "cpu", comm_threads=args.comm_threads)
    torch.set_num_threads(1)
    rank, n = dist.get_rank(), dist.get_world_size()
    fns = {a: get_algorithm(a) for a in algos}
    dtype = getattr(torch, args.dtype)
    elem = torch.empty((), dtype=dtype).element_size()
    if rank == 0:
        print(f"# world_size={n} dtype={args.dtype} rounds={args.rounds} warmup={args.warmup} "
              f"comm_threads={env.comm_threads} "
              "(median over rounds; "
              f"ratio = median of per-round busbw / builtin's)")
        print(f"{'size':>10} {'algo':>18} {'time_us':>10} {'busbw_GB/s':>11} {'vs_builtin':>10}")
    for size in [parse_size(s) for s in args.sizes.split(",")]:
        t = torch.ones(max(1, size // elem), dtype=dtype)
        nbytes = t.numel() * elem
        iters = max(2, min(20, int(args.budget_bytes // nbytes)))
        for fn in fns.values():  # warm up connections and allocator
            fn(t)
        times = {a: [] for a in algos}
        for r in range(args.rounds):
            order = list(algos)
            random.Random(r).shuffle(order)  # seeded: every rank runs the same order
            for a in order:
                times[a].append(time_block(fns[a], t, iters, args.warmup))
        if rank == 0:
            factor = 2 * (n - 1) / n if n > 1 else 0.0
            for a in algos:
                med = statistics.median(times[a])
                ratio = statistics.median(b / x for b, x in zip(times["builtin"], times[a]))
                print(f"{nbytes:>10} {a:>18} {med * 1e6:>10.0f} {nbytes / med * factor / 1e9:>11.3f} "
                      f"{ratio:>10.2f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
