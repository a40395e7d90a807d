"""Plot helpers shared by the ddp_lab benchmarks (matplotlib, Agg backend: no display)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (works on headless nodes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def human_bytes(n: float) -> str:
    """4096 -> '4 KiB', 67108864 -> '64 MiB' (binary units, as nccl-tests' sizes are)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:g} {unit}" if unit == "B" else f"{n:.4g} {unit}"
        n /= 1024
    return f"{n:g} GiB"  # pragma: no cover


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
