"""Allreduce benchmark in the style of NVIDIA's nccl-tests (all_reduce_perf).

    torchrun --standalone --nproc_per_node=4 -m ddp_lab.bench.collectives
    torchrun --standalone --nproc_per_node=2 -m ddp_lab.bench.collectives \
        min_bytes=1024 max_bytes=1048576 factor=4 'algos=[builtin,ring]' dtype=bfloat16
    python -m ddp_lab.bench.collectives          # a world of one (busbw is 0 there)
    torchrun --standalone --nproc_per_node=3 -m ddp_lab.bench.collectives mode=interleaved

mode=interleaved times the algorithms against builtin in shuffled rounds
instead of sweeping them one after another: see collectives_interleaved.py.
What follows is mode=sweep, the default.

For every message size from `min_bytes` to `max_bytes` (multiplying by `factor`,
like nccl-tests' -b/-e/-f) and every algorithm in `algos` (names of
ddp_lab.collectives.ALGORITHMS), each rank:

1. fills its buffer with a rank-dependent integer pattern whose sum over ranks
   is known exactly, runs the allreduce once and counts the elements that
   differ from that sum (`wrong`, summed over ranks: nccl-tests' #wrong);
2. runs up to `warmup` untimed calls;
3. after a barrier, times back-to-back in-place calls and takes its mean time
   per call; the reported time is the slowest rank's (a MAX reduction), so a
   straggler shows, as in nccl-tests.

The timed calls work on a zero-filled buffer: an in-place SUM of zeros stays
zero, so repeated calls neither overflow float16 nor fall into denormals,
which would change the cost of the additions.

Iterations per size: the correctness call doubles as the first warm-up and
gives a cost estimate t (slowest rank). Then min(`warmup`, 0.5 * time_budget_s / t)
warm-up calls run, and min(`iters`, max(`min_iters`, time_budget_s / t)) calls are
timed. Small messages therefore get `iters` calls, large ones as few as `min_iters`,
and a sweep's length is bounded by about (#sizes x #algos x 2 x time_budget_s) plus
the large sizes' `min_iters` calls. All these decisions use the MAX-reduced
estimate, so every rank runs the same number of calls.

Bandwidths follow nccl-tests (doc/PERFORMANCE.md there):
  algbw = size / time                     (GB/s, 1 GB = 1e9 bytes)
  busbw = algbw * 2 (n - 1) / n           (allreduce's bus-bandwidth factor)
busbw is comparable across world sizes: it is the per-link speed a ring
allreduce would need to reach the measured time.

Outputs in the run directory (outputs/bench/collectives/<run id>/ unless
hydra.run.dir=... says otherwise):
  collectives.csv   algo,size_bytes,count,dtype,world_size,time_us,algbw_gbps,busbw_gbps,wrong
  collectives.png   busbw against size (log x) and time against size (log-log)
  tb/               TensorBoard scalars busbw/<algo>, algbw/<algo> (GB/s) and
                    time_us/<algo>, with global_step = log2(size_bytes) rounded
                    to an integer (12 = 4 KiB, 20 = 1 MiB, 26 = 64 MiB)
"""
from __future__ import annotations

import csv
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import hydra
import torch
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from torch.distributed.elastic.multiprocessing.errors import get_error_handler, record

import ddp_lab.config  # noqa: F401  (registers the ${ddp_lab.run_id:} resolver)
from ddp_lab import tuning
from ddp_lab.bench import collectives_interleaved as interleaved
from ddp_lab.config import CONFIG_PATH, ConfigError
from ddp_lab.distributed import DistEnv, resolve_backend, teardown
from ddp_lab.provenance import hydra_command, write_record

CSV_COLUMNS = ["algo", "size_bytes", "count", "dtype", "world_size",
               "time_us", "algbw_gbps", "busbw_gbps", "wrong"]

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
# nccl-tests' short type names, for the printed table.
_TYPE_LABEL = {"float32": "float", "float64": "double", "bfloat16": "bfloat16", "float16": "half"}
# Largest n such that every integer in [-n, n] is exact in the type: the check
# pattern and all its partial sums stay inside, so any summation order is exact.
_EXACT_INT = {"float32": 2 ** 24, "float64": 2 ** 53, "bfloat16": 2 ** 8, "float16": 2 ** 11}


# ----------------------------------------------------------------- formulas
def algbw_gbps(size_bytes: float, time_us: float) -> float:
    """Algorithm bandwidth: bytes of the message over the time of one call, GB/s."""
    return size_bytes / (time_us * 1e-6) / 1e9


def busbw_factor(world_size: int) -> float:
    """nccl-tests' allreduce factor 2(n-1)/n: the bytes each rank must send per byte."""
    return 2.0 * (world_size - 1) / world_size


def busbw_gbps(algbw: float, world_size: int) -> float:
    return algbw * busbw_factor(world_size)


def message_sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """min_bytes, min_bytes*factor, ... up to and including max_bytes (as nccl-tests)."""
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s *= factor
    return sizes


# --------------------------------------------------------------- validation
@dataclass(frozen=True)
class Plan:
    mode: str  # sweep | interleaved
    sizes: list[int]
    algos: list[str]
    dtype_name: str
    dtype: torch.dtype
    elem_size: int


def _int_key(cfg, key: str, minimum: int, hint: str) -> int:
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or float(value) != int(value):
        raise ConfigError(f"{key}={value!r} must be an integer; {hint}")
    if int(value) < minimum:
        raise ConfigError(f"{key}={value!r} must be >= {minimum}; {hint}")
    return int(value)


def known_algorithms() -> list[str]:
    from ddp_lab.collectives import ALGORITHMS

    return list(ALGORITHMS)


def validate(cfg: DictConfig, known_algos: list[str] | None = None) -> Plan:
    """Check the whole config before any collective; same verdict on every rank.

    Raises ConfigError naming the key and the fix.
    """
    known = known_algorithms() if known_algos is None else list(known_algos)
    dtype_name = str(cfg.dtype)
    if dtype_name not in DTYPES:
        raise ConfigError(f"dtype={dtype_name!r} is not one of {', '.join(DTYPES)}; e.g. dtype=float32")
    elem = torch.empty((), dtype=DTYPES[dtype_name]).element_size()
    min_b = _int_key(cfg, "min_bytes", 1, "e.g. min_bytes=4096")
    max_b = _int_key(cfg, "max_bytes", 1, "e.g. max_bytes=67108864 (64 MiB)")
    if min_b > max_b:
        raise ConfigError(f"min_bytes={min_b} is larger than max_bytes={max_b}; "
                          "swap them or raise max_bytes")
    factor = cfg.factor
    if (isinstance(factor, bool) or not isinstance(factor, (int, float))
            or float(factor) != int(factor) or int(factor) < 2):
        raise ConfigError(f"factor={factor!r} must be an integer >= 2 (the size multiplier "
                          "between steps, nccl-tests' -f); e.g. factor=2")
    for key, value in (("min_bytes", min_b), ("max_bytes", max_b)):
        if value % elem:
            raise ConfigError(
                f"{key}={value} is not a multiple of the {elem}-byte element size of "
                f"dtype={dtype_name}; use a multiple of {elem}, e.g. {key}={max(elem, value - value % elem)}")
    _int_key(cfg, "warmup", 0, "e.g. warmup=5")
    iters = _int_key(cfg, "iters", 1, "e.g. iters=50")
    min_iters = _int_key(cfg, "min_iters", 1, "e.g. min_iters=3")
    if min_iters > iters:
        raise ConfigError(f"min_iters={min_iters} is larger than iters={iters}; lower min_iters or raise iters")
    budget = cfg.time_budget_s
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget <= 0:
        raise ConfigError(f"time_budget_s={budget!r} must be a positive number of seconds; e.g. time_budget_s=0.5")
    algos = list(cfg.algos) if OmegaConf.is_list(cfg.algos) else [cfg.algos]
    if not algos:
        raise ConfigError(f"algos is empty; name at least one of {', '.join(known)}")
    for a in algos:
        if a not in known:
            raise ConfigError(f"algos: unknown algorithm {a!r}; choose from {', '.join(known)}, "
                              f"e.g. 'algos=[builtin,ring]'")
    algos = list(dict.fromkeys(algos))  # drop repeats, keep order
    if cfg.mode == "interleaved":  # ratios to builtin: it always runs
        return Plan("interleaved", interleaved.sizes_of(cfg, elem), list(dict.fromkeys(["builtin", *algos])),
                    dtype_name, DTYPES[dtype_name], elem)
    if cfg.mode != "sweep":
        raise ConfigError(f"mode={cfg.mode!r} is not one of sweep, interleaved")
    return Plan("sweep", message_sizes(min_b, max_b, int(factor)), algos, dtype_name, DTYPES[dtype_name], elem)


# ------------------------------------------------------------ correctness
def pattern_bound(dtype_name: str, world_size: int) -> int:
    """K such that values in [-K, K] and all sums of up to world_size of them are exact."""
    return max(1, min(2 ** 20, _EXACT_INT[dtype_name] // world_size))


def fill_pattern(buf: torch.Tensor, rank: int, world_size: int, dtype_name: str) -> None:
    """Element i of rank r: ((i + 7919 r) mod (2K+1)) - K, an integer in [-K, K]."""
    buf.copy_(_pattern_int(buf.numel(), rank, world_size, dtype_name, buf.device))


def _pattern_int(count: int, rank: int, world_size: int, dtype_name: str,
                 device: torch.device) -> torch.Tensor:
    k = pattern_bound(dtype_name, world_size)
    i = torch.arange(count, dtype=torch.int64, device=device)
    return torch.remainder(i + 7919 * rank, 2 * k + 1) - k


def count_wrong(fn: Callable, size: int, env: DistEnv, cfg: DictConfig, plan: Plan) -> int:
    """One call of fn on the check pattern: the elements, over all ranks, that
    differ from the exact sum (-1 with check=false)."""
    buf = torch.empty(size // plan.elem_size, dtype=plan.dtype, device=env.device)
    fill_pattern(buf, env.rank, env.world_size, plan.dtype_name)
    fn(buf)
    if not cfg.check:
        return -1
    want = expected_sum(buf.numel(), env.world_size, plan.dtype_name, env.device)
    wrong = torch.tensor([int((buf != want).sum().item())], dtype=torch.float64, device=env.device)
    dist.all_reduce(wrong)
    return int(wrong.item())


def expected_sum(count: int, world_size: int, dtype_name: str, device: torch.device) -> torch.Tensor:
    """The exact elementwise sum of every rank's pattern (computed in int64)."""
    total = torch.zeros(count, dtype=torch.int64, device=device)
    for r in range(world_size):
        total += _pattern_int(count, r, world_size, dtype_name, device)
    return total.to(DTYPES[dtype_name])


# ------------------------------------------------------------------ timing
class _Sweep:
    def __init__(self, env: DistEnv, cfg: DictConfig, plan: Plan):
        self.env, self.cfg, self.plan = env, cfg, plan
        self.cuda = env.device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.env.device)

    def reduce(self, value: float, op) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self.env.device)
        dist.all_reduce(t, op=op)
        return float(t.item())

    def timed(self, fn: Callable, buf: torch.Tensor, n: int) -> float:
        """Mean seconds per call over n back-to-back calls on this rank (after a barrier)."""
        dist.barrier()
        self.sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn(buf)
        self.sync()
        return (time.perf_counter() - t0) / n

    def point(self, algo: str, fn: Callable, size: int) -> dict:
        env, cfg, plan = self.env, self.cfg, self.plan
        count = size // plan.elem_size
        buf = torch.empty(count, dtype=plan.dtype, device=env.device)
        # 1. correctness (also the first warm-up call and the cost estimate)
        fill_pattern(buf, env.rank, env.world_size, plan.dtype_name)
        t_first = self.timed(fn, buf, 1)
        wrong = -1  # -1: not checked (check=false)
        if cfg.check:
            want = expected_sum(count, env.world_size, plan.dtype_name, env.device)
            wrong = int(self.reduce(int((buf != want).sum().item()), dist.ReduceOp.SUM))
            del want
        estimate = self.reduce(t_first, dist.ReduceOp.MAX)
        # 2. warm-up on zeros, at most half the budget
        buf.zero_()
        budget = float(cfg.time_budget_s)
        n_warm = min(int(cfg.warmup), int(0.5 * budget / max(estimate, 1e-9)))
        if n_warm > 0:
            estimate = self.reduce(self.timed(fn, buf, n_warm), dist.ReduceOp.MAX)
        # 3. timed calls
        n_iter = min(int(cfg.iters), max(int(cfg.min_iters), int(budget / max(estimate, 1e-9))))
        per_call = self.timed(fn, buf, n_iter)
        slowest = self.reduce(per_call, dist.ReduceOp.MAX)
        time_us = slowest * 1e6
        alg = algbw_gbps(size, time_us)
        return {
            "algo": algo, "size_bytes": size, "count": count, "dtype": plan.dtype_name,
            "world_size": env.world_size, "time_us": _sig(time_us),
            "algbw_gbps": _sig(alg), "busbw_gbps": _sig(busbw_gbps(alg, env.world_size)),
            "wrong": wrong, "iters": n_iter,
        }


def median_of_runs(paths: list[str | Path]) -> list[dict]:
    """Combine repeated sweeps: per (algo, dtype, world_size, size) the median time_us.

    On a shared machine one sweep can catch a burst of someone else's load;
    the median over a few sweeps, taken minutes apart, does not. algbw/busbw are
    recomputed from the median time; wrong is the largest count of any run.

        from ddp_lab.bench.collectives import median_of_runs, write_rows
        write_rows(median_of_runs(["run1/collectives.csv", "run2/collectives.csv",
                                   "run3/collectives.csv"]), "collectives_median.csv")
    """
    import statistics

    groups: dict[tuple, list[dict]] = {}
    for path in paths:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                key = (r["algo"], r["dtype"], int(r["world_size"]), int(r["size_bytes"]))
                groups.setdefault(key, []).append(r)
    out = []
    for (algo, dtype, world, size), rs in groups.items():
        t = statistics.median(float(r["time_us"]) for r in rs)
        alg = algbw_gbps(size, t)
        out.append({"algo": algo, "size_bytes": size, "count": int(rs[0]["count"]), "dtype": dtype,
                    "world_size": world, "time_us": _sig(t), "algbw_gbps": _sig(alg),
                    "busbw_gbps": _sig(busbw_gbps(alg, world)),
                    "wrong": max(int(r["wrong"]) for r in rs)})
    return out


def write_rows(rows: list[dict], path: str | Path) -> Path:
    """Write rows in collectives.csv's format."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return Path(path)


def _sig(x: float, digits: int = 6) -> float:
    """Round to significant digits: tiny bandwidths keep their precision in the CSV."""
    return float(f"{x:.{digits}g}")


def _header(plan: Plan) -> str:
    return ("#\n"
            f"# {'size':>12} {'count':>12} {'type':>8} {'algo':>16} {'time':>11} "
            f"{'algbw':>8} {'busbw':>8} {'#wrong':>7} {'iters':>6}\n"
            f"# {'(B)':>12} {'(elements)':>12} {'':>8} {'':>16} {'(us)':>11} "
            f"{'(GB/s)':>8} {'(GB/s)':>8} {'':>7} {'':>6}")


def _line(r: dict) -> str:
    return (f"  {r['size_bytes']:>12} {r['count']:>12} {_TYPE_LABEL[r['dtype']]:>8} {r['algo']:>16} "
            f"{r['time_us']:>11.1f} {r['algbw_gbps']:>8.3f} {r['busbw_gbps']:>8.3f} "
            f"{r['wrong'] if r['wrong'] >= 0 else 'N/A':>7} {r['iters']:>6}")


def _init_world_of_one(backend: str, env: DistEnv) -> None:
    """A plain `python -m` run: a one-rank group, so every algorithm runs its own code."""
    if not dist.is_initialized():
        dist.init_process_group(backend=resolve_backend(backend, env.device),
                                store=dist.HashStore(), rank=0, world_size=1,
                                device_id=env.device if env.device.type == "cuda" else None)


def _refuse_an_earlier_sweep(run_dir: Path, env: DistEnv, name: str = "collectives.csv") -> None:
    """Never overwrite the results of an earlier sweep (a reused hydra.run.dir).

    Rank 0's view decides, on every rank, so that all of them stop together.
    """
    taken = torch.tensor([int(env.is_main and (run_dir / name).exists())],
                         device=env.device)
    dist.all_reduce(taken)
    if taken.item():
        raise ConfigError(f"hydra.run.dir={run_dir} already holds {name} from an earlier "
                          "sweep; choose another hydra.run.dir (or leave it out: a new folder "
                          "per launch)")


def run(cfg: DictConfig, run_dir: Path) -> list[dict]:
    """The sweep; returns the rows (on every rank), writes the outputs on rank 0."""
    plan = validate(cfg)  # before any collective, identical on every rank
    env = tuning.start(cfg.dist)
    # Each as this machine runs it: the tuned ones with its plan, hand-written
    # ones at the priority gloo's threads have (see ddp_lab.tuning).
    fns = {a: tuning.allreduce(a, env) for a in plan.algos}
    rows: list[dict] = []
    writer = None
    try:
        if not env.distributed:
            _init_world_of_one(cfg.dist.backend, env)
        if plan.mode == "interleaved":
            _refuse_an_earlier_sweep(run_dir, env, "interleaved.csv")
            run_dir.mkdir(parents=True, exist_ok=True)
            return interleaved.run(cfg, plan, env, fns, run_dir,
                                   lambda algo, fn, size: count_wrong(fn, size, env, cfg, plan))
        _refuse_an_earlier_sweep(run_dir, env)
        backend = dist.get_backend()
        sweep = _Sweep(env, cfg, plan)
        if env.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            print(f"# ddp_lab.bench.collectives: allreduce SUM, in place, world_size={env.world_size}, "
                  f"backend={backend}, device={env.device}, dtype={plan.dtype_name}")
            print(f"# sizes {plan.sizes[0]}..{plan.sizes[-1]} B x{int(cfg.factor)}, algos {','.join(plan.algos)}, "
                  f"warmup<={cfg.warmup}, iters {cfg.min_iters}..{cfg.iters} within ~{cfg.time_budget_s}s per size, "
                  f"time = slowest rank's mean per call")
            print(f"# run directory: {run_dir}")
            print(_header(plan), flush=True)
            if cfg.tensorboard:
                from torch.utils.tensorboard import SummaryWriter

                writer = SummaryWriter(str(run_dir / "tb"))
                writer.add_text("config", "```\n" + OmegaConf.to_yaml(cfg) + "\n```")
        csv_path = run_dir / "collectives.csv"
        handle = open(csv_path, "w", newline="") if env.is_main else None
        try:
            out = csv.DictWriter(handle, fieldnames=CSV_COLUMNS, extrasaction="ignore") if handle else None
            if out:
                out.writeheader()
            for algo in plan.algos:
                fn = fns[algo]
                for size in plan.sizes:
                    r = sweep.point(algo, fn, size)
                    rows.append(r)
                    if env.is_main:
                        print(_line(r), flush=True)
                        out.writerow(r)
                        handle.flush()
                        if writer is not None:
                            step = round(math.log2(size))
                            writer.add_scalar(f"busbw/{algo}", r["busbw_gbps"], step)
                            writer.add_scalar(f"algbw/{algo}", r["algbw_gbps"], step)
                            writer.add_scalar(f"time_us/{algo}", r["time_us"], step)
        finally:
            if handle:
                handle.close()
        if env.is_main:
            if cfg.check:
                total_wrong = sum(r["wrong"] for r in rows)
                print(f"# wrong elements in total: {total_wrong} {'OK' if total_wrong == 0 else 'FAILED'}")
            print(f"# wrote {csv_path}")
            write_record(run_dir, hydra_command("ddp_lab.bench.collectives"),
                         {"world_size": env.world_size, "backend": backend,
                          "device": str(env.device), "comm_threads": env.comm_threads})
            if cfg.plot:
                from ddp_lab.bench.plots import plot_collectives

                png = plot_collectives(rows, run_dir / "collectives.png",
                                       f"allreduce {plan.dtype_name}, {env.world_size} ranks, {backend} on "
                                       f"{env.device.type} (time = slowest rank)")
                print(f"# wrote {png}")
            if writer is not None:
                print(f"# wrote {run_dir / 'tb'} (global_step = log2(size_bytes))")
        return rows
    finally:
        if writer is not None:
            writer.close()
        teardown()


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="bench_collectives")
@record
def main(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        run(cfg, run_dir)
    except ConfigError as e:
        # A bad input: one line on stderr (rank 0; the other ranks reach the same
        # verdict), the message in torchrun's failure summary, exit status 2.
        if os.environ.get("RANK", "0") == "0":
            print(f"ddp_lab.bench.collectives: error: {e}", file=sys.stderr, flush=True)
        get_error_handler().record_exception(e)
        raise SystemExit(2)


if __name__ == "__main__":
    main()
