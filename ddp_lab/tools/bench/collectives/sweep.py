"""Allreduce benchmark in the style of NVIDIA's nccl-tests (all_reduce_perf), and with
`collective=reduce_scatter|all_gather` their reduce_scatter_perf and all_gather_perf.

    torchrun --standalone --nproc_per_node=4 -m ddp_lab.tools.bench.collectives
    torchrun --standalone --nproc_per_node=2 -m ddp_lab.tools.bench.collectives \
        min_bytes=1024 max_bytes=1048576 factor=4 'algos=[builtin,ring]' dtype=bfloat16
    python -m ddp_lab.tools.bench.collectives          # a world of one (busbw is 0 there)
    torchrun --standalone --nproc_per_node=3 -m ddp_lab.tools.bench.collectives mode=interleaved
    torchrun --standalone --nproc_per_node=2 -m ddp_lab.tools.bench.collectives collective=reduce_scatter

mode=interleaved times the algorithms against builtin in shuffled rounds
instead of sweeping them one after another: see interleaved.py.
What follows is mode=sweep, the default. Its parts: sweep_plan.py (the config
checked, the bandwidth formulas), check.py (the exact-sum check), output.py
(the CSV, the printed table, medians of sweeps), algorithms.py (what is timed); this file times each point
and runs the sweep.

For every message size from `min_bytes` to `max_bytes` (multiplying by `factor`,
like nccl-tests' -b/-e/-f) and every algorithm in `algos` (names of
ddp_lab.collectives.ALGORITHMS), each rank:

1. fills its buffer with a rank-dependent integer pattern whose sum over ranks
   is known exactly, runs the allreduce once and counts the elements that
   differ from that sum (`wrong`, summed over ranks: nccl-tests' #wrong);
2. runs up to `warmup` untimed calls;
3. after a barrier, times back-to-back in-place calls and takes its mean time
   per call; the reported time is the slowest rank's (a MAX reduction), so a
   straggler shows. nccl-tests averages the ranks' times by default (its
   `-a 1`); `-a 3` is this one. The two differ by how far apart the ranks
   end the timed calls, spread over their number.

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

collective=reduce_scatter and collective=all_gather time one of all-reduce's
two halves, with the algorithms that have it: `builtin`
(dist.reduce_scatter_tensor, SUM, into a chunk-sized output of its own /
dist.all_gather_into_tensor with this rank's chunk of the buffer as input, in
place), `ring_textbook` (ddp_lab.collectives.ring_textbook_reduce_scatter /
ring_textbook_all_gather, in place on the whole buffer) and `direct`
(direct_reduce_scatter / direct_all_gather, in place). As in nccl-tests, a
size is the whole buffer, all ranks' chunks together, and busbw = algbw *
(n - 1) / n: each rank sends (n-1)/n of the buffer. Sizes are rounded down to a
multiple of n x the element size, so every chunk is whole (a line says so when
that changes one). The check: reduce_scatter compares this rank's chunk with
the sum's, all_gather the whole buffer with every rank's chunk (check.py).

Outputs in the run directory (outputs/bench/collectives/<run id>/ unless
hydra.run.dir=... says otherwise):
  collectives.csv   algo,size_bytes,count,dtype,world_size,time_us,algbw_gbps,busbw_gbps,wrong
                    (reduce_scatter, all_gather: then ,collective)
  collectives.png   busbw against size (log x) and time against size (log-log)
  tb/               TensorBoard scalars busbw/<algo>, algbw/<algo> (GB/s) and
                    time_us/<algo>, with global_step = log2(size_bytes) rounded
                    to an integer (12 = 4 KiB, 20 = 1 MiB, 26 = 64 MiB)
"""
from __future__ import annotations

import csv
import dataclasses
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import hydra
import torch
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from torch.distributed.elastic.multiprocessing.errors import get_error_handler, record
from torch.utils.tensorboard import SummaryWriter

import ddp_lab.config  # noqa: F401  (registers the ${ddp_lab.run_id:} resolver)
from ddp_lab import tuning
from ddp_lab.config import CONFIG_PATH, ConfigError, say
from ddp_lab.distributed import DistEnv, resolve_backend, teardown
from ddp_lab.telemetry.provenance import hydra_command, write_record
from ddp_lab.tools.bench.collectives import interleaved
from ddp_lab.tools.bench.collectives.algorithms import collective_fns
from ddp_lab.tools.bench.collectives.check import count_wrong, fill_input, result_of, wrong_elements
from ddp_lab.tools.bench.collectives.output import csv_columns, header, line, sig
from ddp_lab.tools.bench.collectives.sweep_plan import Plan, algbw_gbps, busbw_gbps, chunked_sizes, validate
from ddp_lab.tools.bench.plots import plot_collectives

# What the printed header says each collective does.
_WHAT = {
    "all_reduce": "allreduce SUM, in place",
    "reduce_scatter": "reduce_scatter SUM (builtin: into a chunk of its own; ours: in place), "
                      "size = the whole buffer",
    "all_gather": "all_gather, in place, size = the whole buffer",
}


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

    def timed(self, fn: Callable, buf: torch.Tensor, n: int) -> tuple[float, torch.Tensor]:
        """Mean seconds per call over n back-to-back calls on this rank (after a
        barrier), and what the last call returned."""
        dist.barrier()
        self.sync()
        t0 = time.perf_counter()
        for _ in range(n):
            out = fn(buf)
        self.sync()
        return (time.perf_counter() - t0) / n, out

    def point(self, algo: str, fn: Callable, size: int) -> dict:
        env, cfg, plan = self.env, self.cfg, self.plan
        count = size // plan.elem_size
        buf = torch.empty(count, dtype=plan.dtype, device=env.device)
        # 1. correctness (also the first warm-up call and the cost estimate)
        fill_input(buf, plan.collective, env.rank, env.world_size, plan.dtype_name)
        t_first, out = self.timed(fn, buf, 1)
        wrong = -1  # -1: not checked (check=false)
        if cfg.check:
            wrong = wrong_elements(result_of(plan.collective, buf, out), count, env, plan)
        del out
        estimate = self.reduce(t_first, dist.ReduceOp.MAX)
        # 2. warm-up on zeros, at most half the budget
        buf.zero_()
        budget = float(cfg.time_budget_s)
        n_warm = min(int(cfg.warmup), int(0.5 * budget / max(estimate, 1e-9)))
        if n_warm > 0:
            estimate = self.reduce(self.timed(fn, buf, n_warm)[0], dist.ReduceOp.MAX)
        # 3. timed calls
        n_iter = min(int(cfg.iters), max(int(cfg.min_iters), int(budget / max(estimate, 1e-9))))
        per_call, _ = self.timed(fn, buf, n_iter)
        slowest = self.reduce(per_call, dist.ReduceOp.MAX)
        time_us = slowest * 1e6
        alg = algbw_gbps(size, time_us)
        return {
            "algo": algo, "size_bytes": size, "count": count, "dtype": plan.dtype_name,
            "world_size": env.world_size, "time_us": sig(time_us),
            "algbw_gbps": sig(alg), "busbw_gbps": sig(busbw_gbps(alg, env.world_size, plan.collective)),
            "wrong": wrong, "iters": n_iter, "collective": plan.collective,
        }


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


def _write_record(run_dir: Path, env: DistEnv, plan: Plan) -> None:
    """record.json: the command and the machine beside the figures (ddp_lab.telemetry.provenance)."""
    write_record(run_dir, hydra_command("ddp_lab.tools.bench.collectives"),
                 {"mode": plan.mode, "collective": plan.collective, "world_size": env.world_size,
                  "backend": dist.get_backend(),
                  "device": str(env.device), "comm_threads": env.comm_threads})


def run(cfg: DictConfig, run_dir: Path) -> list[dict]:
    """The sweep; returns the rows (on every rank), writes the outputs on rank 0."""
    plan = validate(cfg)  # before any collective, identical on every rank
    env = tuning.start(cfg.dist)
    rows: list[dict] = []
    writer = None
    try:
        # reduce_scatter, all_gather: whole chunks, now that the world size is known
        sizes, resized = chunked_sizes(plan.sizes, env.world_size, plan.elem_size, plan.collective)
        plan = dataclasses.replace(plan, sizes=sizes)
        # Each as this machine runs it: the tuned ones with its plan, hand-written
        # ones at the priority gloo's threads have (see ddp_lab.tuning).
        fns = collective_fns(plan, env)
        if not env.distributed:
            _init_world_of_one(cfg.dist.backend, env)
        if plan.mode == "interleaved":
            _refuse_an_earlier_sweep(run_dir, env, "interleaved.csv")
            run_dir.mkdir(parents=True, exist_ok=True)
            if env.is_main and resized:
                print(f"# {resized}")
            rows = interleaved.run(cfg, plan, env, fns, run_dir,
                                   lambda algo, fn, size: count_wrong(fn, size, env, cfg, plan))
            if env.is_main:
                _write_record(run_dir, env, plan)
            return rows
        _refuse_an_earlier_sweep(run_dir, env)
        backend = dist.get_backend()
        sweep = _Sweep(env, cfg, plan)
        if env.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            print(f"# ddp_lab.tools.bench.collectives: {_WHAT[plan.collective]}, world_size={env.world_size}, "
                  f"backend={backend}, device={env.device}, dtype={plan.dtype_name}")
            print(f"# sizes {plan.sizes[0]}..{plan.sizes[-1]} B x{int(cfg.factor)}, algos {','.join(plan.algos)}, "
                  f"warmup<={cfg.warmup}, iters {cfg.min_iters}..{cfg.iters} within ~{cfg.time_budget_s}s per size, "
                  f"time = slowest rank's mean per call")
            if resized:
                print(f"# {resized}")
            print(f"# run directory: {run_dir}")
            print(header(plan), flush=True)
            if cfg.tensorboard:
                writer = SummaryWriter(str(run_dir / "tb"))
                writer.add_text("config", "```\n" + OmegaConf.to_yaml(cfg) + "\n```")
        csv_path = run_dir / "collectives.csv"
        handle = open(csv_path, "w", newline="") if env.is_main else None
        try:
            out = csv.DictWriter(handle, fieldnames=csv_columns(plan.collective), extrasaction="ignore") \
                if handle else None
            if out:
                out.writeheader()
            for algo in plan.algos:
                fn = fns[algo]
                for size in plan.sizes:
                    r = sweep.point(algo, fn, size)
                    rows.append(r)
                    if env.is_main:
                        print(line(r), flush=True)
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
            _write_record(run_dir, env, plan)
            if cfg.plot:
                png = plot_collectives(rows, run_dir / "collectives.png",
                                       f"{'allreduce' if plan.collective == 'all_reduce' else plan.collective} "
                                       f"{plan.dtype_name}, {env.world_size} ranks, {backend} on "
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
            say(f"ddp_lab.tools.bench.collectives: error: {e}")
        get_error_handler().record_exception(e)
        raise SystemExit(2) from None

