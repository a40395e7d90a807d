"""epochs.md: each epoch's wall time, images/s, MFU and test accuracy, from the runs' TensorBoard logs.

    python docs/results/2026-11-26_xeon-amx-16c-h200x1_gpu-training/epochs.py
"""
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

HERE = Path(__file__).resolve().parent
TAGS = {"perf/epoch_s": "{:.2f}", "perf/samples_per_sec": "{:,.0f}", "perf/mfu": "{:.1%}", "acc/test": "{:.4f}"}


def table(run: Path) -> list[str]:
    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    columns = {tag: [e.value for e in events.Scalars(tag)] for tag in TAGS}
    lines = [f"### {run.name}", "", "| epoch | " + " | ".join(TAGS) + " |", "|---" * (len(TAGS) + 1) + "|"]
    for i in range(len(columns["acc/test"])):
        lines.append(f"| {i + 1} | " + " | ".join(fmt.format(columns[t][i]) for t, fmt in TAGS.items()) + " |")
    return lines + [""]


if __name__ == "__main__":
    lines = [line for run in ("lenet_fast", "resnet18", "lenet_fast-after-fix") for line in table(HERE / run)]
    (HERE / "epochs.md").write_text("\n".join(lines))
    print("\n".join(lines))
