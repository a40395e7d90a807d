"""Fit alpha, beta (and gamma) to measured allreduce times; read the measurements.

The inputs are ddp_lab.tools.bench.collectives CSV files; each row becomes a Point,
and every algorithm's points are fitted with its own formula
(ddp_lab.tools.costmodel.formulas), weighting each by 1/measured time so that the
fit minimises relative error.
"""
from __future__ import annotations

import csv
import glob
import itertools
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch

from ddp_lab.config import ConfigError
from ddp_lab.tools.costmodel.formulas import Params, coefficients


def nnls(a: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """min ||a x - y|| subject to x >= 0, for a handful of columns.

    Exact by enumeration: the NNLS optimum is the unconstrained least-squares
    solution on its own support, so among all column subsets whose restricted
    solution is non-negative, the one with the smallest residual is optimal.
    2^k solves; k <= 3 here. Columns are scaled to unit norm first because
    alpha's and beta's columns differ by ~1e8.
    """
    a = a.to(torch.float64)
    y = y.to(torch.float64).reshape(-1, 1)
    k = a.shape[1]
    norms = a.norm(dim=0)
    norms[norms == 0] = 1.0
    a_s = a / norms
    best_x = torch.zeros(k, dtype=torch.float64)
    best_r = float(y.norm())
    for size in range(1, k + 1):
        for cols in itertools.combinations(range(k), size):
            sub = a_s[:, list(cols)]
            sol = torch.linalg.lstsq(sub, y, driver="gelsd").solution.reshape(-1)
            if bool((sol < 0).any()):
                continue
            r = float((sub @ sol.reshape(-1, 1) - y).norm())
            if r < best_r - 1e-15:
                best_r = r
                best_x = torch.zeros(k, dtype=torch.float64)
                best_x[list(cols)] = sol
    return best_x / norms


@dataclass
class Point:
    algo: str
    world_size: int
    size_bytes: int
    time_s: float
    source: str = ""


@dataclass
class Fit:
    algo: str
    params: Params
    points: list[Point]
    rel_errors: list[float] = field(default_factory=list)  # (model - measured) / measured
    cores: int | None = None  # the measured ranks shared this many cores (None: no correction)

    def model_time(self, model: Callable, pt: Point) -> float:
        """The model's time for a measured point, with the measurement's core sharing."""
        return contention(pt.world_size, self.cores) * self.params.time(model, pt.world_size, pt.size_bytes)

    @property
    def median_abs_err(self) -> float:
        return statistics.median(abs(e) for e in self.rel_errors)

    @property
    def max_abs_err(self) -> float:
        return max(abs(e) for e in self.rel_errors)

    def per_world(self) -> dict[int, float]:
        out: dict[int, list[float]] = {}
        for p, e in zip(self.points, self.rel_errors):
            out.setdefault(p.world_size, []).append(abs(e))
        return {w: statistics.median(v) for w, v in sorted(out.items())}


def contention(p: int, cores: int | None) -> float:
    """How much slower p ranks run on `cores` shared cores than on p own ones: max(1, p/cores)."""
    return 1.0 if not cores else max(1.0, p / cores)


def fit(points: Sequence[Point], model: Callable, gamma: float | None, algo: str = "",
        source: str = "fitted", cores: int | None = None) -> Fit:
    """Fit alpha, beta (and gamma when it is None) to measured times, minimising relative error.

    Each row (alpha, beta, gamma coefficients; measured time) is divided by the
    measured time, so the residual is (model - measured) / measured. With
    `cores`, the measured ranks shared that many cores: each row is scaled by
    contention(p, cores) (see the module docstring).
    """
    if not points:
        raise ValueError(f"no measured points to fit {algo or 'the model'} to")
    rows = torch.tensor([[contention(pt.world_size, cores) * c
                          for c in coefficients(model, pt.world_size, pt.size_bytes)] for pt in points],
                        dtype=torch.float64)
    t = torch.tensor([pt.time_s for pt in points], dtype=torch.float64)
    if gamma is None:
        a, y = rows, t.clone()
        w = a / t.reshape(-1, 1)
        if int(torch.linalg.matrix_rank(w / w.norm(dim=0).clamp_min(1e-300))) < 3:
            raise ValueError(
                f"{algo or 'this model'}: beta and gamma cannot be fitted separately: in its "
                "formula the bytes sent and the bytes added keep a fixed ratio, so their columns "
                "are parallel; measure gamma (gamma=measure) or give it (e.g. gamma=2.5e-10)")
    else:
        a, y = rows[:, :2], t - gamma * rows[:, 2]
    x = nnls(a / t.reshape(-1, 1), y / t)
    alpha, beta = float(x[0]), float(x[1])
    g = float(x[2]) if gamma is None else float(gamma)
    params = Params(alpha, beta, g, source)
    f = Fit(algo, params, list(points), cores=cores)
    f.rel_errors = [(f.model_time(model, pt) - pt.time_s) / pt.time_s for pt in points]
    return f


def measure_gamma(threads: int = 1, sizes: Iterable[int] = (1 << 24, 1 << 25, 1 << 26),
                  repeats: int = 5) -> float:
    """Seconds per byte of an in-place float32 add (a.add_(b)) on this machine's CPU.

    That is the reduction the point-to-point algorithms run; gloo's builtin
    uses its own vectorised loop of the same memory-bound kind. Sizes of
    16-64 MiB (beyond the caches, where gamma matters); median over sizes of
    the best of `repeats` runs.
    """
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        per_byte = []
        for nbytes in sizes:
            a = torch.ones(nbytes // 4)
            b = torch.ones(nbytes // 4)
            a.add_(b)
            best = math.inf
            for _ in range(repeats):
                t0 = time.perf_counter()
                a.add_(b)
                best = min(best, time.perf_counter() - t0)
            per_byte.append(best / nbytes)
        return statistics.median(per_byte)
    finally:
        torch.set_num_threads(old)


def fit_mixed(rows: list[tuple[Callable, Point]], gamma: float | None,
               cores: int | None = None) -> tuple[Params, list[float]] | None:
    """One (alpha, beta[, gamma]) for points of several algorithms, each with its own formula."""
    coef = torch.tensor([[contention(pt.world_size, cores) * c
                          for c in coefficients(m, pt.world_size, pt.size_bytes)] for m, pt in rows],
                        dtype=torch.float64)
    t = torch.tensor([pt.time_s for _, pt in rows], dtype=torch.float64)
    if gamma is None:
        x = nnls(coef / t.reshape(-1, 1), torch.ones_like(t))
        params = Params(float(x[0]), float(x[1]), float(x[2]), "fit: shared")
    else:
        x = nnls(coef[:, :2] / t.reshape(-1, 1), (t - gamma * coef[:, 2]) / t)
        params = Params(float(x[0]), float(x[1]), gamma, "fit: shared")
    errs = [(contention(pt.world_size, cores) * params.time(m, pt.world_size, pt.size_bytes) - pt.time_s)
            / pt.time_s for m, pt in rows]
    return params, errs


# ------------------------------------------------------------------ inputs
CSV_COLUMNS = ["algo", "size_bytes", "count", "dtype", "world_size",
               "time_us", "algbw_gbps", "busbw_gbps", "wrong"]


def expand_inputs(inputs: Iterable[str]) -> list[Path]:
    """Files, run directories (their collectives.csv) and glob patterns -> CSV paths."""
    paths: list[Path] = []
    for item in inputs:
        item = str(item)
        matches = sorted(glob.glob(item)) if any(c in item for c in "*?[") else [item]
        if not matches:
            raise ConfigError(f"inputs: pattern {item!r} matches no file")
        for m in matches:
            p = Path(m)
            if p.is_dir():
                p = p / "collectives.csv"
            if not p.is_file():
                raise ConfigError(f"inputs: {m!r} is not a collectives.csv file nor a run directory "
                                  "holding one (paths are relative to where you launched)")
            paths.append(p)
    return paths


def read_points(paths: Iterable[Path], log=print) -> list[Point]:
    """Rows of collectives.csv files as Points; skips wrong != 0 and world_size 1, saying so."""
    points: list[Point] = []
    for path in paths:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in CSV_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise ConfigError(f"inputs: {path} lacks columns {', '.join(missing)}; "
                                  "is it a ddp_lab.tools.bench.collectives output?")
            skipped_wrong = skipped_single = 0
            for r in reader:
                if int(r["wrong"]) > 0:
                    skipped_wrong += 1
                    continue
                if int(r["world_size"]) < 2:
                    skipped_single += 1
                    continue
                points.append(Point(r["algo"], int(r["world_size"]), int(r["size_bytes"]),
                                    float(r["time_us"]) * 1e-6, str(path)))
        if skipped_wrong:
            log(f"# {path}: skipped {skipped_wrong} rows with wrong > 0 (incorrect results have no meaningful time)")
        if skipped_single:
            log(f"# {path}: skipped {skipped_single} rows with world_size 1 (no communication to model)")
    return points
