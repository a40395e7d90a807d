"""loss/val at steps 144 and 168 of each seed's run, from its TensorBoard (how val_loss.txt was read).
Usage: python at_step.py RUNS_DIR/<strategy>"""
import glob
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

for seed in sorted(glob.glob(sys.argv[1] + "/seed*")):
    values = {e.step: e.value for e in EventAccumulator(seed + "/tb", size_guidance={"scalars": 0}).Reload()
              .Scalars("loss/val")}
    print(seed.rsplit("/", 1)[-1], "val_loss_at_144", values.get(144), "at_168", values.get(168))
