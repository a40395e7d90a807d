"""All-reduces with idle gaps between them, as training makes them (compute, then an all-reduce):
each rank sleeps GAP seconds, then both time one builtin (gloo ring) all-reduce of N bytes; the
median of REPEATS, after 3 untimed. Run under torchrun, one rank per emulated host:
    python gapped.py <bytes,...> <gaps in s,...> <repeats>"""
import statistics
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
repeats = int(sys.argv[3])
sizes, gaps = [int(x) for x in sys.argv[1].split(",")], [float(x) for x in sys.argv[2].split(",")]
for nbytes in sizes:
    t = torch.ones(nbytes // 4)
    for gap in gaps:
        times = []
        for i in range(3 + repeats):
            time.sleep(gap)
            dist.barrier()  # both start together: a gap of one rank is not the other's wait
            t0 = time.perf_counter()
            dist.all_reduce(t)
            if i >= 3:
                times.append(time.perf_counter() - t0)
        if dist.get_rank() == 0:
            print(f"bytes {nbytes} gap_s {gap} median_ms {1e3 * statistics.median(times):.1f} "
                  f"min_ms {1e3 * min(times):.1f} max_ms {1e3 * max(times):.1f}", flush=True)
dist.destroy_process_group()
