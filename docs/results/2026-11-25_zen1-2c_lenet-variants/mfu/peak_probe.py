# Ran with the code of commit 35db1a2cf; it imports ddp_lab internals that have moved or gone since,
# so it runs at that commit only: git worktree add /tmp/ddp_lab-35db1a2cf 35db1a2cf
import sys, time, torch
from ddp_lab.mfu import measure_matmul
threads, size = int(sys.argv[1]), int(sys.argv[2])
e = measure_matmul(torch.device("cpu"), torch.float32, threads, size, 5)
print(f"threads={threads} size={size} best {e['flops_per_sec']/1e9:.1f} median {e['median_flops_per_sec']/1e9:.1f} GFLOP/s", flush=True)
