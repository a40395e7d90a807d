"""All-reduces beside computation, as training makes them: does the link's all-reduce cost more
when the rank also computes? One rank per emulated host, gloo's ring (builtin) all-reduce of N bytes:
  alone    the all-reduce after an idle gap (compute done, as sync=flat runs it)
  after    right after COMPUTE_S of matrix products (no gap)
  during   started in the background, then COMPUTE_S of matrix products, then waited for (as DDP
           overlaps its buckets with the backward): the time beyond the computation alone
Medians of REPEATS after 3 untimed. Run under torchrun:
    python contended.py <bytes> <compute seconds> <repeats>"""
import statistics
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
nbytes, compute_s, repeats = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
t, a = torch.ones(nbytes // 4), torch.randn(256, 256)


def compute(seconds: float) -> int:
    """Matrix products for about `seconds` (the same count on every repeat: calibrated once)."""
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ a
        n += 1
    return n


products = compute(compute_s)  # calibrate: this many products take about compute_s


def products_only() -> float:
    t0 = time.perf_counter()
    for _ in range(products):
        a @ a
    return time.perf_counter() - t0


results = {"compute": [], "alone": [], "after": [], "during": []}
for i in range(3 + repeats):
    dist.barrier()
    c = products_only()
    time.sleep(0.3)
    dist.barrier()
    t0 = time.perf_counter()
    dist.all_reduce(t)
    alone = time.perf_counter() - t0
    dist.barrier()
    products_only()
    t0 = time.perf_counter()
    dist.all_reduce(t)
    after = time.perf_counter() - t0
    dist.barrier()
    t0 = time.perf_counter()
    work = dist.all_reduce(t, async_op=True)
    products_only()
    work.wait()
    during = time.perf_counter() - t0 - c
    if i >= 3:
        for k, v in zip(results, (c, alone, after, during)):
            results[k].append(v)
if dist.get_rank() == 0:
    print(f"bytes {nbytes} compute_s {compute_s} " + " ".join(
        f"{k}_ms {1e3 * statistics.median(v):.1f} ({1e3 * min(v):.1f}-{1e3 * max(v):.1f})"
        for k, v in results.items()), flush=True)
dist.destroy_process_group()
