"""loss/val at every evaluation of each run (TensorBoard's), and the medians over seeds by strategy
(how val_loss.txt was read). Usage: python curves.py OUT_DIR (time_to_accuracy's --out, its runs/ kept)"""
import glob
import statistics
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

for run in sorted(glob.glob(sys.argv[1] + "/runs/*")):
    by_seed = {}
    for seed in sorted(glob.glob(run + "/seed*")):
        acc = EventAccumulator(seed + "/tb", size_guidance={"scalars": 0}).Reload()
        by_seed[seed.rsplit("/", 1)[-1]] = {e.step: e.value for e in acc.Scalars("loss/val")}
    print(run.rsplit("/", 1)[-1])
    steps = sorted(next(iter(by_seed.values())))
    for name, values in by_seed.items():
        print(f"  {name:7s}", " ".join(f"{values[s]:.4f}" for s in steps))
    print("  median ", " ".join(f"{statistics.median(v[s] for v in by_seed.values()):.4f}" for s in steps))
    print("  steps  ", " ".join(f"{s:6d}" for s in steps))
