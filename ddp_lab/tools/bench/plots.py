"""Plot helpers shared by the ddp_lab benchmarks (matplotlib, Agg backend: no display)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

from ddp_lab.tools.figures import pyplot


def plot_collectives(rows: Iterable[Mapping], path: Path, title: str) -> Path:
    """busbw against message size (log x) and time per call (log-log), one line per algo.

    `rows` are collectives.csv rows (dicts with algo, size_bytes, time_us, busbw_gbps).
    """
    plt = pyplot()
    series: dict[str, list[tuple[float, float, float]]] = {}
    for r in rows:
        series.setdefault(str(r["algo"]), []).append(
            (float(r["size_bytes"]), float(r["busbw_gbps"]), float(r["time_us"])))
    fig, (ax_bw, ax_t) = plt.subplots(1, 2, figsize=(12, 4.5))
    for algo, pts in series.items():
        pts.sort()
        sizes = [p[0] for p in pts]
        ax_bw.plot(sizes, [p[1] for p in pts], marker="o", ms=3, label=algo)
        ax_t.plot(sizes, [p[2] for p in pts], marker="o", ms=3, label=algo)
    for ax in (ax_bw, ax_t):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    ax_bw.set_ylabel("busbw (GB/s)")
    ax_bw.set_title("bus bandwidth (higher is better)")
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time per allreduce (us)")
    ax_t.set_title("time per call (lower is better)")
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_scaling(rows: Iterable[Mapping], path: Path) -> None:
    """Throughput and scaling efficiency against ranks, one line per (kind, sync).

    `rows` are bench.scaling's rows (kind, sync, world_size, samples_per_sec, efficiency).
    """
    plt = pyplot()
    rows = list(rows)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    series = sorted({(r["kind"], r["sync"]) for r in rows})
    for kind, sync in series:
        rs = [r for r in rows if (r["kind"], r["sync"]) == (kind, sync)]
        ws = [r["world_size"] for r in rs]
        ax1.plot(ws, [r["samples_per_sec"] for r in rs], "o-", label=f"{kind} {sync}")
        if all(r["efficiency"] is not None for r in rs):
            ax2.plot(ws, [r["efficiency"] for r in rs], "o-", label=f"{kind} {sync}")
        one = next((r["samples_per_sec"] for r in rs if r["world_size"] == 1), None)
        if one:
            ax1.plot(ws, [one * w for w in ws], ":", color="gray")
    ax1.set(xlabel="ranks", ylabel="images/s (dotted: ideal)", title="throughput")
    ax2.set(xlabel="ranks", ylabel="throughput(N) / (N x throughput(1))",
            title="scaling efficiency", ylim=(0, 1.1))
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
