"""Tables, CSV files and plots of fits and predictions."""
from __future__ import annotations

import csv
from pathlib import Path

from ddp_lab.tools.costmodel.fitting import Fit, Point
from ddp_lab.tools.costmodel.formulas import MODELS
from ddp_lab.tools.costmodel.prediction import Prediction
from ddp_lab.tools.figures import pyplot


def _fmt_s(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} us"


def print_fits(fits: dict[str, Fit], gamma_note: str, log=print) -> None:
    log("")
    log("FITTED to MEASURED times (relative error = (model - measured) / measured)")
    log(f"# gamma: {gamma_note}")
    log(f"  {'algo':<17} {'points':>6} {'alpha':>10} {'beta':>11} {'1/beta':>9} {'gamma':>11} "
        f"{'median|err|':>11} {'max|err|':>9}   median|err| per world size")
    log(f"  {'':<17} {'':>6} {'(us)':>10} {'(ns/B)':>11} {'(GB/s)':>9} {'(ns/B)':>11}")
    for algo, f in fits.items():
        p = f.params
        inv = f"{1e-9 / p.beta:.3f}" if p.beta > 0 else "inf"
        per_w = ", ".join(f"p={w}: {e:.0%}" for w, e in f.per_world().items())
        log(f"  {algo:<17} {len(f.points):>6} {p.alpha * 1e6:>10.1f} {p.beta * 1e9:>11.4f} {inv:>9} "
            f"{p.gamma * 1e9:>11.4f} {f.median_abs_err:>11.1%} {f.max_abs_err:>9.1%}   {per_w}")


def print_predictions(preds: list[Prediction], world_sizes: list[int], notes: dict[str, str],
                      log=print) -> None:
    log("")
    log("PREDICTED allreduce time and scaling efficiency = compute / (compute + allreduce)")
    log("# step time = compute + allreduce: no overlap of communication with the backward pass assumed")
    groups: dict[tuple[str, str], list[Prediction]] = {}
    for pr in preds:
        groups.setdefault((pr.params_name, pr.gradient), []).append(pr)
    for (pname, grad), items in groups.items():
        first = items[0]
        log("")
        log(f"params={pname}  gradient={grad} ({first.gradient_bytes:,} B)  "
            f"compute={_fmt_s(first.compute_s)}/step ({notes.get(grad, '')})")
        head = "".join(f"{'p=' + str(w):>20}" for w in world_sizes)
        log(f"  {'algo':<17} {'(params from)':<22}{head}")
        by_algo: dict[str, list[Prediction]] = {}
        for pr in items:
            by_algo.setdefault(pr.algo, []).append(pr)
        for algo, rows in by_algo.items():
            cells = "".join(f"{_fmt_s(r.allreduce_s) + ' ' + format(r.efficiency, '4.0%'):>20}" for r in rows)
            log(f"  {algo:<17} {rows[0].params_from:<22}{cells}")


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def plot_fits(fits: dict[str, Fit], path: Path) -> Path:
    """Measured points and fitted model, time against size, one panel per algorithm."""
    plt = pyplot()
    n = len(fits)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 4), squeeze=False)
    for ax, (algo, f) in zip(axes[0], fits.items()):
        model = MODELS[algo]
        for w in sorted({pt.world_size for pt in f.points}):
            pts = sorted((pt.size_bytes, pt.time_s) for pt in f.points if pt.world_size == w)
            line, = ax.plot([s for s, _ in pts], [t * 1e6 for _, t in pts], "o", ms=3,
                            label=f"measured p={w}")
            sizes = [s for s, _ in pts]
            ax.plot(sizes, [f.model_time(model, Point(algo, w, s, 0.0)) * 1e6 for s in sizes], "-",
                    color=line.get_color(), label=f"model p={w}")
        _log_log(ax, "message size (bytes)", "time per allreduce (us)",
                 f"{algo}: median |err| {f.median_abs_err:.0%}")
    return _save(plt, fig, path)


def plot_predictions(preds: list[Prediction], path: Path) -> Path:
    """Predicted allreduce time against world size (log-log); dashed: compute time per step."""
    plt = pyplot()
    pnames = list(dict.fromkeys(p.params_name for p in preds))
    grads = list(dict.fromkeys(p.gradient for p in preds))
    fig, axes = plt.subplots(len(pnames), len(grads), figsize=(5.5 * len(grads), 4 * len(pnames)),
                             squeeze=False)
    for i, pname in enumerate(pnames):
        for j, grad in enumerate(grads):
            ax = axes[i][j]
            sel = [p for p in preds if p.params_name == pname and p.gradient == grad]
            for algo in dict.fromkeys(p.algo for p in sel):
                rows = sorted((p.world_size, p.allreduce_s) for p in sel if p.algo == algo)
                ax.plot([w for w, _ in rows], [t for _, t in rows], marker="o", ms=3, label=algo)
            if sel:
                ax.axhline(sel[0].compute_s, ls="--", color="gray", label="compute / step")
            _log_log(ax, "world size (ranks)", "predicted allreduce time (s)",
                     f"PREDICTED, params={pname}, {grad}")
    return _save(plt, fig, path)


def _log_log(ax, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
