"""Alpha-beta-gamma cost model of allreduce: fit it to measurements, predict at scale.

    # fit to benchmark runs (any world sizes), predict 8..4096 ranks for LeNet and ResNet-18
    python -m ddp_lab.costmodel 'inputs=[docs/results/collectives_2p.csv,docs/results/collectives_4p.csv]'
    # nominal interconnects instead of (or beside) the fit
    python -m ddp_lab.costmodel 'params=[ib_100g,eth_25g]' 'compute_ms={lenet: 2, resnet18: 60}'

Configuration: conf/costmodel.yaml (Hydra, like every ddp_lab entry point).
Output: outputs/costmodel/<run id>/ with fit.csv, fit_points.csv, fit.png,
predictions.csv, predictions.png.

The model (Thakur, Rabenseifner & Gropp, "Optimization of Collective
Communication Operations in MPICH", IJHPCA 2005) prices an allreduce of N bytes
on p ranks with three machine constants:

    alpha  seconds per message (latency, software overhead included)
    beta   seconds per byte sent over a link (1/beta = link bandwidth)
    gamma  seconds per byte reduced (the local additions)

and one formula per algorithm (MODELS below). Every formula is linear in
alpha, beta and gamma, so fitting them to measured times is a least-squares
problem with non-negativity constraints.

What can and cannot be fitted: in all four formulas the bytes sent and the
bytes added come in the same 2:1 proportion (an allreduce sends every byte it
reduces twice: once to reduce, once to distribute), so the beta and gamma
columns of the design matrix are parallel and no measurement of allreduce
times can tell them apart. gamma therefore comes from elsewhere: `gamma:
measure` times an in-place float32 add on this machine (the operation the
algorithms run), or give a number; beta is then the per-byte cost left over.
`gamma: fit` is refused with that explanation whenever the columns are
dependent (it would be accepted for a model where they are not).

Fitting weights every point by 1/measured time, so the fit minimises the
relative error: a 4 KiB message counts as much as a 64 MiB one.

Oversubscribed measurements (`measured_cores`): the formulas assume that every
rank has its own processor and link. Benchmarks run as several processes on one
host with fewer cores than ranks break that: p ranks share c cores, so each
step of the collective takes about p/c times longer (at 4 ranks on 2 cores,
every algorithm's time roughly doubles on top of the formula's p-dependence).
With measured_cores=c, each measured point is modelled as
max(1, p/c) x formula(p, N) during the fit only; predictions are made for one
core (or device) per rank, i.e. without the factor. null (the default) fits the
plain textbook formulas.
"""
from __future__ import annotations

import csv
import glob
import itertools
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import ddp_lab.config  # noqa: F401  (registers the ${ddp_lab.run_id:} resolver)
import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from ddp_lab.config import CONFIG_PATH, ConfigError


# ------------------------------------------------------------------ models
def _pof2_floor(p: int) -> int:
    """Largest power of two <= p."""
    return 1 << (int(p).bit_length() - 1)


def naive(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    """Reduce to a root, broadcast from it, as ddp_lab.collectives implements it.

    The root receives p-1 messages of N bytes, adds each, and sends p-1 back:
    2(p-1)(alpha + N beta) + (p-1) N gamma. Linear in p.
    """
    return 2 * (p - 1) * (alpha + n * beta) + (p - 1) * n * gamma


def ring(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    """Ring reduce-scatter + all-gather: 2(p-1) alpha + 2(p-1)/p N beta + (p-1)/p N gamma.

    Bandwidth-optimal (the beta term stays below 2 N beta for any p); the
    latency term grows linearly with p.
    """
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta + (p - 1) / p * n * gamma


def halving_doubling(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    """Rabenseifner: recursive-halving reduce-scatter + recursive-doubling all-gather.

    For p a power of two: 2 log2(p) alpha + 2(p-1)/p N beta + (p-1)/p N gamma.
    Otherwise, as in the paper (and MPICH), with p' the largest power of two
    below p: the first 2(p - p') ranks fold in pairwise (one full message and
    its addition, alpha + N beta + N gamma), the p' remaining ranks run the
    power-of-two algorithm, and the folded-out ranks get the result back at the
    end (alpha + N beta).
    """
    q = _pof2_floor(p)
    t = 2 * math.log2(q) * alpha + 2 * (q - 1) / q * n * beta + (q - 1) / q * n * gamma
    if q != p:
        t += (alpha + n * beta + n * gamma) + (alpha + n * beta)
    return t


def tree(p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    """Binomial-tree reduce, then binomial-tree broadcast, whole message at each step.

    2 ceil(log2 p) (alpha + N beta) + ceil(log2 p) N gamma: few messages, but
    every step moves all N bytes, so it is for small messages only.
    """
    steps = math.ceil(math.log2(p)) if p > 1 else 0
    return 2 * steps * (alpha + n * beta) + steps * n * gamma


# Algorithm names match ddp_lab.bench.collectives' (and ddp_lab.collectives').
# "builtin" is the backend's own allreduce (gloo's or NCCL's), a black box here:
# it is modelled, and fitted, with the ring formula, which is what NCCL uses for
# large messages and what gloo's ring variants do.
MODELS: dict[str, Callable[[int, float, float, float, float], float]] = {
    "builtin": ring,
    "naive": naive,
    "ring": ring,
    "halving_doubling": halving_doubling,
    "tree": tree,
}


def get_model(name: str) -> Callable:
    if name not in MODELS:
        raise ConfigError(f"unknown algorithm {name!r}; the cost model knows {', '.join(MODELS)}")
    return MODELS[name]


def coefficients(model: Callable, p: int, n: float) -> tuple[float, float, float]:
    """(d t/d alpha, d t/d beta, d t/d gamma): the model is linear, so unit inputs give them."""
    return model(p, n, 1.0, 0.0, 0.0), model(p, n, 0.0, 1.0, 0.0), model(p, n, 0.0, 0.0, 1.0)


@dataclass(frozen=True)
class Params:
    alpha: float  # s per message
    beta: float   # s per byte sent
    gamma: float  # s per byte reduced
    source: str = ""

    def time(self, model: Callable, p: int, n: float) -> float:
        return model(p, n, self.alpha, self.beta, self.gamma)


# ------------------------------------------------------------------ fitting
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
                                  "is it a ddp_lab.bench.collectives output?")
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


# --------------------------------------------------------------- prediction
@dataclass(frozen=True)
class Gradient:
    label: str
    nbytes: int
    model_name: str | None  # set when it names a ddp_lab model


def resolve_gradient(entry) -> Gradient:
    """'lenet' / 'resnet18' (a conf/model name) -> its gradient bytes; an integer -> itself."""
    if isinstance(entry, bool):
        raise ConfigError(f"gradients: {entry!r} is neither a model name nor a byte count")
    if isinstance(entry, int) or (isinstance(entry, str) and entry.isdigit()):
        n = int(entry)
        if n <= 0:
            raise ConfigError(f"gradients: {entry!r} must be a positive number of bytes")
        return Gradient(f"bytes_{n}", n, None)
    from ddp_lab.models import build_model, gradient_bytes, load_model_config

    try:
        cfg = load_model_config(str(entry))
    except ValueError as e:
        raise ConfigError(f"gradients: {e}; or give a byte count, e.g. gradients=[44691240]") from None
    return Gradient(str(entry), gradient_bytes(build_model(cfg)), str(entry))


def measure_compute_s(model_name: str, batch_size: int, iters: int, threads: int) -> float:
    """Median seconds of one training step (forward, backward, SGD step) on random 28x28 inputs.

    On this machine's CPU with `threads` torch threads, as one torchrun worker runs.
    """
    from ddp_lab.models import build_model, load_model_config

    cfg = load_model_config(model_name)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        net = build_model(cfg)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        x = torch.randn(batch_size, int(cfg.in_channels), 28, 28)
        y = torch.randint(0, int(cfg.num_classes), (batch_size,))
        loss_fn = torch.nn.CrossEntropyLoss()
        times = []
        for i in range(iters + 1):  # the first step is a warm-up
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss_fn(net(x), y).backward()
            opt.step()
            if i:
                times.append(time.perf_counter() - t0)
        return statistics.median(times)
    finally:
        torch.set_num_threads(old)


@dataclass
class Prediction:
    params_name: str
    params_from: str
    algo: str
    gradient: str
    gradient_bytes: int
    world_size: int
    allreduce_s: float
    compute_s: float

    @property
    def step_s(self) -> float:
        # No overlap of communication with the backward pass is assumed.
        return self.compute_s + self.allreduce_s

    @property
    def efficiency(self) -> float:
        return self.compute_s / self.step_s if self.step_s > 0 else 1.0


def predict(params: Params, algo: str, grad: Gradient, world_sizes: Iterable[int],
            compute_s: float, params_name: str) -> list[Prediction]:
    model = MODELS[algo]
    return [Prediction(params_name, params.source, algo, grad.label, grad.nbytes, p,
                       params.time(model, p, grad.nbytes), compute_s) for p in world_sizes]


# ------------------------------------------------------------------- output
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
    from ddp_lab.bench.plots import pyplot

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
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{algo}: median |err| {f.median_abs_err:.0%}")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("time per allreduce (us)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_predictions(preds: list[Prediction], path: Path) -> Path:
    """Predicted allreduce time against world size (log-log); dashed: compute time per step."""
    from ddp_lab.bench.plots import pyplot

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
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("world size (ranks)")
            ax.set_ylabel("predicted allreduce time (s)")
            ax.set_title(f"PREDICTED, params={pname}, {grad}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --------------------------------------------------------------------- main
def _as_list(value) -> list:
    if OmegaConf.is_list(value):
        return list(value)
    if value is None:
        return []
    return [value]


def _gamma_setting(cfg) -> float | str:
    g = cfg.gamma
    if isinstance(g, str):
        if g in ("measure", "fit"):
            return g
        try:
            g = float(g)
        except ValueError:
            raise ConfigError(f"gamma={g!r} must be measure, fit, or seconds per byte (e.g. gamma=2.5e-10)") from None
    if isinstance(g, bool) or not isinstance(g, (int, float)) or g < 0:
        raise ConfigError(f"gamma={g!r} must be measure, fit, or a non-negative number of seconds per byte")
    return float(g)


def validate(cfg) -> dict:
    """Check keys before doing any work; returns the parsed settings."""
    params = [str(p) for p in _as_list(cfg.params)]
    if not params:
        raise ConfigError("params is empty; use params=[fitted] and/or preset names: "
                          + ", ".join(cfg.presets))
    for p in params:
        if p != "fitted" and p not in cfg.presets:
            raise ConfigError(f"params: {p!r} is neither 'fitted' nor a preset; presets: "
                              + ", ".join(cfg.presets))
    inputs = expand_inputs(_as_list(cfg.inputs))
    if "fitted" in params and not inputs:
        raise ConfigError("params=fitted needs measurements: inputs=[path/to/collectives.csv, ...] "
                          "(from ddp_lab.bench.collectives); or predict from a preset only, e.g. "
                          "'params=[ib_100g]'")
    for name in params:
        if name == "fitted":
            continue
        pre = cfg.presets[name]
        for key in ("alpha", "beta", "gamma"):
            v = pre.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ConfigError(f"presets.{name}.{key}={v!r} must be a non-negative number")
    algos = [str(a) for a in _as_list(cfg.algos)]
    if not algos:
        raise ConfigError(f"algos is empty; choose from {', '.join(MODELS)}")
    for a in algos:
        get_model(a)
    worlds = _as_list(cfg.world_sizes)
    if not worlds or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in worlds):
        raise ConfigError(f"world_sizes={worlds} must be a non-empty list of integers >= 1, "
                          "e.g. 'world_sizes=[8,64,512,4096]'")
    grads = [resolve_gradient(g) for g in _as_list(cfg.gradients)]
    if not grads:
        raise ConfigError("gradients is empty; e.g. 'gradients=[lenet,resnet18]' or a byte count")
    compute_ms = dict(cfg.compute_ms or {})
    for g in grads:
        v = compute_ms.get(g.label)
        if v is None and g.model_name is None:
            raise ConfigError(f"gradients: {g.label} is a byte count, so its compute time cannot be "
                              f"measured; give it in ms per step, e.g. +compute_ms.{g.label}=50")
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
            raise ConfigError(f"compute_ms.{g.label}={v!r} must be a non-negative number of milliseconds")
    cores = cfg.measured_cores
    if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int) or cores < 1):
        raise ConfigError(f"measured_cores={cores!r} must be null (textbook model) or the number of CPU "
                          "cores the benchmark's ranks shared, e.g. measured_cores=2")
    for key in ("batch_size", "iters", "threads"):
        v = cfg.compute[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"compute.{key}={v!r} must be an integer >= 1")
    return {"params": params, "inputs": inputs, "gamma": _gamma_setting(cfg), "algos": algos,
            "world_sizes": [int(w) for w in worlds], "gradients": grads, "compute_ms": compute_ms,
            "cores": cores}


def run(cfg, run_dir: Path, log=print) -> dict:
    s = validate(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    fits: dict[str, Fit] = {}
    param_sets: dict[str, dict[str, Params]] = {}

    if "fitted" in s["params"]:
        points = read_points(s["inputs"], log)
        log(f"# MEASURED input: {len(points)} points from {len(s['inputs'])} file(s): "
            + ", ".join(str(p) for p in s["inputs"]))
        if not points:
            raise ConfigError("inputs hold no usable rows (all wrong > 0 or world_size 1)")
        gamma = s["gamma"]
        if gamma == "measure":
            gamma = measure_gamma(int(cfg.compute.threads))
            gamma_note = (f"MEASURED here, {gamma * 1e9:.4f} ns/B = {1e-9 / gamma:.2f} GB/s "
                          f"(float32 add_, {cfg.compute.threads} thread(s)); held fixed in the fit")
        elif gamma == "fit":
            gamma = None
            gamma_note = "fitted"
        else:
            gamma_note = f"given, {gamma * 1e9:.4f} ns/B; held fixed in the fit"
        by_algo: dict[str, list[Point]] = {}
        for pt in points:
            by_algo.setdefault(pt.algo, []).append(pt)
        for algo, pts in by_algo.items():
            if algo not in MODELS:
                log(f"# no cost model for measured algorithm {algo!r}: not fitted")
                continue
            try:
                fits[algo] = fit(pts, MODELS[algo], gamma, algo, source=f"fit: {algo}", cores=s["cores"])
            except ValueError as e:
                raise ConfigError(str(e)) from None
        # One parameter set for the machine, fitted to all measured
        # point-to-point algorithms at once (each row with its own formula):
        # used for algorithms that were not measured (e.g. tree).
        own = [pt for pt in points if pt.algo in MODELS and pt.algo != "builtin"]
        shared = None
        if own:
            rows = [(MODELS[pt.algo], pt) for pt in own]
            shared = _fit_mixed(rows, gamma, s["cores"])
        if s["cores"]:
            log(f"# measured_cores={s['cores']}: measured p ranks modelled as max(1, p/{s['cores']}) x formula "
                "(ranks shared the cores); predictions assume one core or device per rank")
        else:
            log("# textbook formulas as they are (measured_cores=null: no correction for ranks sharing cores)")
        print_fits(fits, gamma_note, log)
        if shared is not None:
            med = statistics.median(abs(e) for e in shared[1])
            log(f"  {'shared (p2p algos)':<17} {len(own):>6} {shared[0].alpha * 1e6:>10.1f} "
                f"{shared[0].beta * 1e9:>11.4f} {1e-9 / shared[0].beta if shared[0].beta else math.inf:>9.3f} "
                f"{shared[0].gamma * 1e9:>11.4f} {med:>11.1%} {max(abs(e) for e in shared[1]):>9.1%}"
                "   (one set for naive+ring+halving_doubling; used for unmeasured algorithms)")
        fitted = {}
        for algo in s["algos"]:
            if algo in fits:
                fitted[algo] = fits[algo].params
            elif shared is not None:
                fitted[algo] = Params(shared[0].alpha, shared[0].beta, shared[0].gamma, "fit: shared")
            else:
                log(f"# fitted: no measurements and no shared fit for {algo}: not predicted")
        param_sets["fitted"] = fitted
        write_csv(run_dir / "fit.csv", [
            {"algo": a, "points": len(f.points), "alpha_s": f.params.alpha,
             "beta_s_per_byte": f.params.beta, "gamma_s_per_byte": f.params.gamma,
             "median_abs_rel_err": round(f.median_abs_err, 4), "max_abs_rel_err": round(f.max_abs_err, 4)}
            for a, f in fits.items()])
        write_csv(run_dir / "fit_points.csv", [
            {"algo": a, "world_size": pt.world_size, "size_bytes": pt.size_bytes,
             "measured_us": round(pt.time_s * 1e6, 3),
             "model_us": round(f.model_time(MODELS[a], pt) * 1e6, 3),
             "rel_err": round(e, 4)}
            for a, f in fits.items() for pt, e in zip(f.points, f.rel_errors)])
        if cfg.plot and fits:
            log(f"# wrote {plot_fits(fits, run_dir / 'fit.png')}")
    for name in s["params"]:
        if name == "fitted":
            continue
        pre = cfg.presets[name]
        p = Params(float(pre.alpha), float(pre.beta), float(pre.gamma), f"preset: {name}")
        param_sets[name] = {algo: p for algo in s["algos"]}
        log(f"# preset {name}: alpha {p.alpha * 1e6:g} us, beta {p.beta * 1e9:g} ns/B "
            f"({1e-9 / p.beta if p.beta else math.inf:g} GB/s), gamma {p.gamma * 1e9:g} ns/B -- "
            f"NOMINAL (vendor figures / assumptions, not measured): {pre.get('note', '')}")

    # compute time per step
    compute_s: dict[str, float] = {}
    notes: dict[str, str] = {}
    for g in s["gradients"]:
        given = s["compute_ms"].get(g.label)
        if given is not None:
            compute_s[g.label] = float(given) * 1e-3
            notes[g.label] = "given"
        else:
            compute_s[g.label] = measure_compute_s(g.model_name, int(cfg.compute.batch_size),
                                                   int(cfg.compute.iters), int(cfg.compute.threads))
            notes[g.label] = (f"MEASURED on this CPU: fwd+bwd+SGD, batch {cfg.compute.batch_size}/rank, "
                              f"{cfg.compute.threads} thread(s)")

    preds: list[Prediction] = []
    for pname, by_algo_params in param_sets.items():
        for g in s["gradients"]:
            for algo, params in by_algo_params.items():
                preds += predict(params, algo, g, s["world_sizes"], compute_s[g.label], pname)
    print_predictions(preds, s["world_sizes"], notes, log)
    if any(p != "fitted" for p in s["params"]):
        log("# presets price the network only; compute times above are the same for every params "
            "set, so give compute_ms for the hardware a preset stands for")
    if "fitted" in s["params"]:
        log(f"# fitted params come from world sizes {sorted({pt.world_size for f in fits.values() for pt in f.points})} "
            "on one host; far larger worlds are an extrapolation of the formulas, not a measurement")
    write_csv(run_dir / "predictions.csv", [
        {"params": p.params_name, "params_from": p.params_from, "algo": p.algo, "gradient": p.gradient,
         "gradient_bytes": p.gradient_bytes, "world_size": p.world_size,
         "allreduce_s": f"{p.allreduce_s:.6g}", "compute_s": f"{p.compute_s:.6g}",
         "step_s": f"{p.step_s:.6g}", "efficiency": round(p.efficiency, 4)} for p in preds])
    log(f"# wrote {run_dir / 'predictions.csv'}")
    if cfg.plot:
        log(f"# wrote {plot_predictions(preds, run_dir / 'predictions.png')}")
    return {"fits": fits, "params": param_sets, "predictions": preds, "compute_s": compute_s}


def _fit_mixed(rows: list[tuple[Callable, Point]], gamma: float | None,
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


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="costmodel")
def main(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        run(cfg, run_dir)
    except ConfigError as e:
        print(f"ddp_lab.costmodel: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2)


if __name__ == "__main__":
    main()
