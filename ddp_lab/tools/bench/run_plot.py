"""A picture of one training run, from its TensorBoard events.

    python -m ddp_lab.tools.bench.run_plot outputs/<run id> [picture.png]

The picture goes to the path given (default: run.png in the run directory);
one that exists already is never drawn over.

Three panels: for a classifier, over the epochs, the training loss, train and
test accuracy, and images/s with the share of each step spent in gradient
communication; for a language model, over the steps, the training loss of the
logged steps with the validation loss, the validation perplexity, and tokens/s.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ddp_lab.tools.figures import pyplot


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of the run's tb/ events: tag -> [(step, value)]."""
    events = EventAccumulator(str(Path(run_dir) / "tb"), size_guidance={"scalars": 0}).Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _language_model(data: dict, axes) -> None:
    def series(tag):
        return [s for s, _ in data.get(tag, [])], [v for _, v in data.get(tag, [])]

    axes[0].plot(*series("loss/train_step"), label="train (logged steps)")
    axes[0].plot(*series("loss/val"), marker="o", label="validation")
    axes[0].set(title="loss (nats per token)", xlabel="step")
    axes[0].legend()
    axes[1].plot(*series("ppl/val"), marker="o")
    axes[1].set(title="validation perplexity", xlabel="step")
    axes[2].plot(*series("perf/tokens_per_sec"), marker="o", color="tab:green")
    axes[2].set(title="tokens/s (all ranks)", xlabel="step")


def plot_run(run_dir: Path, path: Path, title: str | None = None) -> Path:
    data = scalars(run_dir)
    if "loss/val" in data:  # a language model (ddp_lab.training.tasks)
        plt = pyplot()
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
        _language_model(data, axes)
        return _save(plt, fig, path, title)
    missing = [t for t in ("loss/train", "acc/train", "perf/samples_per_sec") if t not in data]
    if missing:
        raise SystemExit(f"{run_dir}/tb has no {', '.join(missing)}: not a ddp_lab.train run "
                         "that finished an epoch")
    epoch = {step: i + 1 for i, (step, _) in enumerate(data["loss/train"])}

    def series(tag):
        return [epoch[s] for s, _ in data.get(tag, []) if s in epoch], \
               [v for s, v in data.get(tag, []) if s in epoch]

    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].plot(*series("loss/train"), marker="o")
    axes[0].set(title="training loss", xlabel="epoch")
    for tag, label in (("acc/train", "train"), ("acc/test", "test")):
        axes[1].plot(*series(tag), marker="o", label=label)
    axes[1].set(title="accuracy", xlabel="epoch")
    axes[1].legend()
    axes[2].plot(*series("perf/samples_per_sec"), marker="o", color="tab:green")
    axes[2].set(title="images/s (all ranks)", xlabel="epoch")
    if "perf/comm_frac" in data:
        share = axes[2].twinx()
        x, y = series("perf/comm_frac")
        share.plot(x, [100 * v for v in y], marker=".", color="tab:red")
        share.set_ylabel("% of the step in gradient sync", color="tab:red")
    return _save(plt, fig, path, title)


def _save(plt, fig, path: Path, title: str | None) -> Path:
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m ddp_lab.tools.bench.run_plot", description=__doc__.split("\n")[0])
    p.add_argument("run_dir", type=Path, help="a run directory of ddp_lab.train")
    p.add_argument("png", type=Path, nargs="?", default=None, help="the picture (default: <run_dir>/run.png)")
    p.add_argument("--title", default=None)
    args = p.parse_args(argv)
    png = args.png or args.run_dir / "run.png"
    if png.exists():
        p.error(f"{png} exists already: give another path for the picture")
    print(plot_run(args.run_dir, png, args.title))


if __name__ == "__main__":
    main()
