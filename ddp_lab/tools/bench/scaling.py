"""Training scaling study: images/s against world size, weak and strong.

    python -m ddp_lab.tools.bench.scaling                           # worlds 1,2; ddp/builtin; both kinds
    python -m ddp_lab.tools.bench.scaling --worlds 1,2,4 --syncs ddp/builtin,flat/ring \\
        --kinds weak --max-steps 200 --repeats 3
    python -m ddp_lab.tools.bench.scaling --worlds 1,2 -- model=resnet18 data=synthetic

Each point is a real `torchrun --standalone --nproc_per_node=N -m ddp_lab.train`
run (world size 1 included, so the 1-rank baseline pays the same DDP and
process costs as the others), with `--threads` torch threads per rank at
every N. Arguments after `--` are Hydra overrides passed to every run.

- weak scaling: the per-rank batch is fixed (`--per-rank-batch`), so the
  global batch grows with N: how much more data per second N ranks process.
- strong scaling: the global batch is fixed (`--global-batch`), so each rank's
  share shrinks with N: how much faster the same training gets.

Scaling efficiency is throughput(N) / (N x throughput(1)), as Horovod reports
it; MFU is each run's own (summary.json, ddp_lab.telemetry.mfu). Results (the median of
`--repeats` runs per point) go to `--out`
(default outputs/bench/scaling/<time>/): scaling.csv, scaling.md, scaling.png.
On a machine with C cores, more than C ranks oversubscribe the CPU: such
points measure contention, not scaling.

Across emulated hosts (ddp_lab.tools.cluster, needs root):

    python -m ddp_lab.tools.bench.scaling --hosts 1,2,4 --rate 100mbit --syncs flat/builtin \
        --kinds weak --fit outputs/costmodel/<run>/fit.csv

--hosts replaces --worlds: each point runs N emulated hosts of one rank each,
on a cluster made for the benchmark with every link shaped to --rate (both
ways; --mtu 9000 for jumbo frames) and removed at the end. The hosts still
share this machine's cores.
--fit (a cost model run's fit.csv) adds the predicted step time beside the
measured one (ddp_lab.tools.bench.scaling_prediction): compute plus the all-reduce
priced. --compute-from takes each point's compute from the same study run on
loopback first (`--worlds` instead of `--hosts`): the cores shared the same way.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from ddp_lab.telemetry.provenance import command_line, write_record
from ddp_lab.tools.bench import fresh_out_dir
from ddp_lab.tools.bench.plots import plot_scaling
from ddp_lab.tools.bench.scaling_prediction import loopback_compute, predicted
from ddp_lab.tools.bench.trainer_runs import run_trainer

# This process only launches runs and reads their files: ddp_lab.tools.cluster,
# .costmodel and .sync (which import torch) are imported where a flag needs
# them, so --help and a bad argument answer within a second rather than in 3.

COLUMNS = ["kind", "sync", "world_size", "global_batch", "per_rank_batch", "samples_per_sec",
           "samples_per_sec_per_rank", "mfu", "efficiency", "comm_frac", "test_acc", "runs",
           "step_ms", "predicted_step_ms"]


@dataclass
class Point:
    kind: str  # weak | strong
    sync: str  # mode/algo
    world_size: int
    global_batch: int
    samples_per_sec: float  # median over repeats
    comm_frac: float | None
    test_acc: float
    runs: int
    step_ms: float | None = None  # median over repeats
    model: str = ""
    described_sync: str = ""  # as summary.json says it, e.g. flat/builtin+bf16
    mfu: float | None = None  # median over repeats, the trainer's (summary.json)

    @property
    def per_rank_batch(self) -> int:
        return self.global_batch // self.world_size


def efficiency_rows(points: list[Point], fit=None, threads: int = 1, loopback=None) -> list[dict]:
    """One row per point, with efficiency against the 1-rank point of the same kind and sync."""
    base = {(p.kind, p.sync): p.samples_per_sec for p in points if p.world_size == 1}
    rows = []
    for p in sorted(points, key=lambda p: (p.kind, p.sync, p.world_size)):
        one = base.get((p.kind, p.sync))
        rows.append({
            "kind": p.kind, "sync": p.sync, "world_size": p.world_size,
            "global_batch": p.global_batch, "per_rank_batch": p.per_rank_batch,
            "samples_per_sec": p.samples_per_sec,
            "samples_per_sec_per_rank": p.samples_per_sec / p.world_size, "mfu": p.mfu,
            "efficiency": p.samples_per_sec / (p.world_size * one) if one else None,
            "comm_frac": p.comm_frac, "test_acc": p.test_acc, "runs": p.runs,
            "step_ms": p.step_ms, "predicted_step_ms": predicted(p, points, fit, threads, loopback),
        })
    return rows


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def markdown_table(rows: list[dict]) -> str:
    lines = ["| kind | sync | ranks | global batch | batch/rank | images/s | images/s/rank | MFU | efficiency | "
             "comm share | test acc | step ms | predicted ms |", "|---" * 13 + "|"]
    for r in rows:
        lines.append(
            f"| {r['kind']} | {r['sync']} | {r['world_size']} | {r['global_batch']} | "
            f"{r['per_rank_batch']} | {_fmt(r['samples_per_sec'], ',.0f')} | "
            f"{_fmt(r['samples_per_sec_per_rank'], ',.0f')} | {_fmt(r.get('mfu'), '.1%')} | "
            f"{_fmt(r['efficiency'], '.0%')} | {_fmt(r['comm_frac'], '.0%')} | {_fmt(r['test_acc'], '.3f')} | "
            f"{_fmt(r['step_ms'], '.1f')} | {_fmt(r['predicted_step_ms'], '.1f')} |")
    return "\n".join(lines) + "\n"


def write_results(rows: list[dict], out: Path) -> None:
    with open(out / "scaling.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    (out / "scaling.md").write_text(markdown_table(rows))
    plot_scaling(rows, out / "scaling.png")


def measure(kind: str, sync: str, world: int, args, out: Path, cluster=None) -> Point:
    mode, algo = sync.split("/")
    batch = args.per_rank_batch * world if kind == "weak" else args.global_batch
    overrides = [f"sync={mode}", f"sync.algo={algo}", f"data.batch_size={batch}",
                 f"trainer.max_steps={args.max_steps}", "trainer.epochs=1",
                 f"trainer.threads={args.threads}", *args.overrides]
    summaries = []
    for r in range(args.repeats):
        run_dir = out / "runs" / f"{kind}-{mode}-{algo}-{world}r-{r}"
        summaries.append(run_trainer(world, overrides, run_dir, args.timeout, cluster))
        print(f"  {kind:6s} {sync:24s} {world} rank(s)  run {r + 1}/{args.repeats}: "
              f"{summaries[-1]['samples_per_sec']:,.0f} img/s", flush=True)
    def median(key):  # over the runs that measured it (None and NaN: not measured)
        values = [s[key] for s in summaries if s.get(key) is not None and s[key] == s[key]]
        return statistics.median(values) if values else None

    return Point(kind, sync, world, batch, median("samples_per_sec"), median("comm_frac"),
                 median("test_acc"), len(summaries), median("step_ms"), summaries[0]["model"],
                 summaries[0]["sync"], median("mfu"))


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m ddp_lab.tools.bench.scaling", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worlds", default="1,2", help="comma-separated world sizes (default 1,2)")
    p.add_argument("--hosts", default=None, help="instead of --worlds: numbers of emulated hosts "
                   "of one rank each, e.g. 1,2,4 (needs --rate and root)")
    p.add_argument("--rate", default=None, help="with --hosts: every link's rate, e.g. 100mbit, 1gbit")
    p.add_argument("--mtu", default=None, help="with --hosts: every link's MTU (default 1500; "
                   "9000: jumbo frames)")
    p.add_argument("--fit", type=Path, default=None,
                   help="a cost model run's fit.csv: adds the predicted step time")
    p.add_argument("--compute-from", type=Path, default=None,
                   help="with --fit and --hosts: a loopback study's scaling.csv, whose step of N ranks "
                        "is the compute of N hosts (the same sharing of the cores)")
    p.add_argument("--syncs", default="ddp/builtin", help="comma-separated mode/algo pairs")
    p.add_argument("--kinds", default="weak,strong", help="weak, strong or both")
    p.add_argument("--per-rank-batch", type=int, default=128, help="weak scaling's batch per rank")
    p.add_argument("--global-batch", type=int, default=256, help="strong scaling's global batch")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per rank, the same at every world size (torchrun only "
                        "sets OMP_NUM_THREADS=1 when it starts 2+ processes, so a 1-rank run would "
                        "otherwise use every core)")
    p.add_argument("--max-steps", type=int, default=150, help="optimizer steps per run")
    p.add_argument("--repeats", type=int, default=3, help="runs per point (the median is kept)")
    p.add_argument("--timeout", type=float, default=1200, help="seconds one run may take")
    p.add_argument("--out", type=Path, default=None, help="output folder")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for every run (after --)")
    args = p.parse_args(argv)
    if (args.hosts is None) != (args.rate is None):
        p.error("--hosts and --rate go together, e.g. --hosts 1,2,4 --rate 100mbit")
    if args.mtu is not None and args.hosts is None:
        p.error("--mtu sets the emulated hosts' links: give it with --hosts and --rate")
    if args.rate is not None:
        from ddp_lab.tools.cluster.shaping import DEFAULT_MTU, ClusterError, parse_mtu, parse_rate
        try:
            parse_rate(args.rate)
            args.mtu = parse_mtu(DEFAULT_MTU if args.mtu is None else args.mtu)
        except ClusterError as e:
            p.error(str(e))
        args.worlds = args.hosts
    try:
        args.worlds = [int(w) for w in args.worlds.split(",")]
    except ValueError:
        p.error(f"--worlds={args.worlds!r} must be comma-separated integers, e.g. 1,2,4")
    if min(args.worlds) < 1:
        p.error("--worlds must all be >= 1")
    args.kinds = args.kinds.split(",")
    if not set(args.kinds) <= {"weak", "strong"}:
        p.error(f"--kinds={','.join(args.kinds)!r}: use weak, strong or weak,strong")
    args.syncs = args.syncs.split(",")
    if any(s.count("/") != 1 for s in args.syncs):
        p.error(f"--syncs={','.join(args.syncs)!r}: each must be mode/algo, e.g. ddp/builtin,flat/ring")
    from ddp_lab.collectives import ALGORITHMS
    from ddp_lab.sync import REGISTRY
    modes = [m for m in REGISTRY if m != "ft_ddp"]  # (one torchrun job: no torchft islands)
    for sync in args.syncs:
        mode, algo = sync.split("/")
        if mode not in modes or algo not in ALGORITHMS:
            p.error(f"--syncs: {sync!r} is not strategy/algo with strategy one of {', '.join(modes)} "
                    f"and algo one of {', '.join(ALGORITHMS)}")
    if "strong" in args.kinds:
        bad = [w for w in args.worlds if args.global_batch % w]
        if bad:
            p.error(f"--global-batch={args.global_batch} does not divide over {bad} ranks")
    if args.repeats < 1 or args.max_steps < 1 or args.threads < 1:
        p.error("--repeats, --max-steps and --threads must be >= 1")
    args.loopback = None
    if args.compute_from is not None:
        try:
            args.loopback = loopback_compute(args)
        except ValueError as e:
            p.error(str(e))
    return args


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    fit = None
    if args.fit is not None:
        from ddp_lab.tools.costmodel.step_time import load_fit
        fit = load_fit(args.fit)
    out = fresh_out_dir(args.out, "outputs/bench/scaling")
    with contextlib.ExitStack() as stack:
        cluster = None
        if args.rate is not None:
            from ddp_lab.tools.cluster import emulated
            cluster = stack.enter_context(emulated(max(args.worlds), args.rate, f"scaling{os.getpid()}",
                                                         args.mtu))
        points = [measure(kind, sync, world, args, out, cluster)
                  for kind in args.kinds for sync in args.syncs for world in sorted(args.worlds)]
    rows = efficiency_rows(points, fit, args.threads, args.loopback)
    write_results(rows, out)
    write_record(out, command_line("ddp_lab.tools.bench.scaling", sys.argv[1:] if argv is None else argv),
                 {"worlds": args.worlds, "kinds": args.kinds, "syncs": args.syncs,
                  "emulated_hosts": args.hosts is not None, "link_rate": args.rate, "link_mtu": args.mtu,
                  "fit": str(args.fit) if args.fit else None,
                  "compute_from": str(args.compute_from) if args.compute_from else None})
    print(markdown_table(rows))
    print(f"written: {out / 'scaling.csv'}, {out / 'scaling.md'}, {out / 'scaling.png'}, "
          f"{out / 'record.json'}")
    return rows


def command() -> None:
    """The `ddp-lab-bench-scaling` command (pyproject.toml's [project.scripts]): main(), its rows kept
    back, since a console script exits with what its function returns."""
    main()


if __name__ == "__main__":
    main()
