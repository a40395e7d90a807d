"""The race past the bandwidth wall: each strategy trained to the same target, timed.

    python -m ddp_lab.tools.bench.time_to_accuracy --hosts 4 --rate 100mbit --target-acc 0.88 --epochs 5
    python -m ddp_lab.tools.bench.time_to_accuracy --ranks 4 --target-acc 0.88 --epochs 5    # loopback
    python -m ddp_lab.tools.bench.time_to_accuracy --hosts 4 --rate 100mbit --target-loss 2.1 \\
        --strategies ddp,diloco:sync.every=16 --epochs 1 -- model=gpt data=text optim=adamw

Each strategy (`--strategies`, sync presets: ddp, powersgd, local_sgd,
diloco, zero, fsdp, each with overrides of its own after colons, e.g.
diloco:sync.outer_momentum=0.5, fsdp:sync.islands=host for HSDP) trains
the same model from the same seed for the same budget
(`--epochs`), evaluated every `--eval-every` steps, with
`trainer.stop_at_target=false`: the run notes when it reached the target and
trains on, so the final figures after the same budget are compared too.
Arguments after `--` are Hydra overrides for every run (a strategy's own keys,
such as sync.every, go after its name: a strategy refuses another's keys).
With --hosts the runs go over emulated hosts of one rank each (--nproc-per-host:
more, on each host's loopback), every link shaped to --rate (ddp_lab.tools.cluster,
needs root); with --ranks, over loopback.

Time to target (MLPerf Training's measure) = steps to target (what the method
does to learning) x time per step (what it does to the network), evaluation
included. Written to `--out` (default outputs/bench/time_to_accuracy/<time>/):
race.csv and race.md (steps and seconds to target, bytes per step, final
figure, step time), race.png (the held-out figure against wall-clock time, a
curve per strategy), record.json, and each run's directory under runs/.
With --fit and --steps-from also by_rate.md: the predicted time at 10 Mbit/s
to 10 Gbit/s, where each strategy starts to pay.

--fit (a cost model fit.csv of the link) with --steps-from (a loopback race
of the same ranks, its race.csv) adds the cost model's prediction beside each
measurement: ddp_lab.tools.costmodel.strategies. --loopback-fit (a fit of loopback
itself) takes the loopback run's own collectives out of its time first.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import os
import re
import sys
from pathlib import Path

from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ddp_lab.telemetry.provenance import command_line, write_record
from ddp_lab.tools.bench import fresh_out_dir
from ddp_lab.tools.bench.race_table import COLUMNS, by_strategy, compare, diverged, fmt, markdown, row, summary_markdown
from ddp_lab.tools.bench.trainer_runs import HYDRA_FLAGS, run_trainer
from ddp_lab.tools.figures import pyplot

# This process only launches runs and reads their files: ddp_lab.tools.cluster and
# ddp_lab.tools.costmodel (which import torch) are imported where a flag needs them,
# so --help and a bad argument answer within a second rather than in 3.

STRATEGIES = ("ddp", "powersgd", "local_sgd", "diloco", "zero", "fsdp")  # sync presets (ddp_lab/sync/registry.py)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m ddp_lab.tools.bench.time_to_accuracy",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=None, help="emulated hosts of one rank each (needs --rate, root)")
    p.add_argument("--rate", default=None, help="with --hosts: every link's rate, e.g. 100mbit, 1gbit")
    p.add_argument("--nproc-per-host", type=int, default=1,
                   help="with --hosts: ranks on each host, talking over its loopback (sync.islands=host: an "
                        "island each)")
    p.add_argument("--ranks", type=int, default=None, help="instead of --hosts: ranks on loopback")
    p.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated sync presets")
    p.add_argument("--target-acc", type=float, default=None, help="held-out accuracy to reach")
    p.add_argument("--target-loss", type=float, default=None, help="held-out loss to reach (language models)")
    p.add_argument("--epochs", type=int, default=5, help="every strategy's budget")
    p.add_argument("--max-steps", type=int, default=0, help="or a budget in steps (0: the epochs')")
    p.add_argument("--seeds", default=None,
                   help="comma-separated seeds (e.g. 1,2,3): every strategy once per seed, interleaved (seed 1 of "
                        "each, then seed 2...), reported as median (range); default: the config's seed, once")
    p.add_argument("--stop-at-target", action="store_true",
                   help="end each run at its target (faster; no final figures after the same budget)")
    p.add_argument("--eval-every", type=int, default=24,
                   help="steps between evaluations (a multiple of sync.every for local_sgd and diloco)")
    p.add_argument("--fit", type=Path, default=None, help="a cost model fit.csv of the link: predictions")
    p.add_argument("--steps-from", type=Path, default=None,
                   help="with --fit: a loopback race's race.csv (steps to target, step time)")
    p.add_argument("--fit-across", type=Path, default=None,
                   help="with --fit: a fit of the link between hosts at one rank each, what prices sync.islands' "
                        "outer gradients across (default: --fit)")
    p.add_argument("--loopback-fit", type=Path, default=None,
                   help="with --fit: a fit.csv of loopback, to price the compute without its collectives")
    p.add_argument("--timeout", type=float, default=3600, help="seconds one run may take")
    p.add_argument("--out", type=Path, default=None, help="output folder")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for every run (after --)")
    args = p.parse_args(argv)
    if (args.hosts is None) == (args.ranks is None):
        p.error("give --hosts N --rate R (emulated hosts) or --ranks N (loopback)")
    if (args.hosts is None) != (args.rate is None):
        p.error("--hosts and --rate go together, e.g. --hosts 4 --rate 100mbit")
    if (args.target_acc is None) == (args.target_loss is None):
        p.error("give one target: --target-acc 0.88 or --target-loss 2.0")
    if (args.fit is None) != (args.steps_from is None):
        p.error("--fit and --steps-from go together: the link's constants and the loopback race's steps")
    if args.loopback_fit is not None and args.fit is None:
        p.error("--loopback-fit goes with --fit and --steps-from: it corrects their prediction")
    args.strategies = args.strategies.split(",")
    bad = [s for s in args.strategies if s.split(":")[0] not in STRATEGIES]
    if bad:
        p.error(f"--strategies: {', '.join(bad)} not among {', '.join(STRATEGIES)} (each may add its own "
                "overrides: diloco:sync.outer_momentum=0.5)")
    try:
        args.seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [None]
    except ValueError:
        p.error(f"--seeds {args.seeds}: give integers separated by commas, e.g. --seeds 1,2,3")
    if len(set(args.seeds)) != len(args.seeds):
        p.error(f"--seeds {','.join(map(str, args.seeds))}: each seed once")
    if args.rate is not None:
        from ddp_lab.tools.cluster.shaping import ClusterError, parse_rate
        try:
            parse_rate(args.rate)
        except ClusterError as e:
            p.error(str(e))
    if min(args.hosts or args.ranks, args.epochs, args.eval_every, args.nproc_per_host) < 1:
        p.error("--hosts/--ranks, --nproc-per-host, --epochs and --eval-every must be >= 1")
    if args.nproc_per_host > 1 and args.hosts is None:
        p.error("--nproc-per-host goes with --hosts (on loopback, --ranks counts every rank)")
    if args.fit_across is not None and args.fit is None:
        p.error("--fit-across goes with --fit and --steps-from: it prices the islands' outer gradients")
    return args


def run_overrides(strategy: str, seed: int | None, args) -> list[str]:
    target = (f"trainer.target_acc={args.target_acc}" if args.target_acc is not None
              else f"trainer.target_loss={args.target_loss}")
    preset, *own = strategy.split(":")
    return [f"sync={preset}", *args.overrides, *own, *([f"seed={seed}"] if seed is not None else []),
            f"trainer.epochs={args.epochs}", f"trainer.max_steps={args.max_steps}",
            f"trainer.eval_every_steps={args.eval_every}", "trainer.eval_every_epochs=0", target,
            f"trainer.stop_at_target={str(args.stop_at_target).lower()}", "trainer.keep_ckpts=0"]


def preflight(args) -> None:
    """Compose and check every strategy's config as ddp_lab.train would, before the first run:
    a strategy that cannot run is refused in one line now, not after the hours the others took.
    (With a user's --config-dir, each run checks its own.)"""
    if any(o.startswith(HYDRA_FLAGS) for o in args.overrides):
        return
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from ddp_lab.config import ConfigError
    from ddp_lab.sync import check, options_of
    from ddp_lab.tools.costmodel.will_it_fit import compose
    for strategy in args.strategies:
        try:
            check(options_of(compose(run_overrides(strategy, args.seeds[0], args)).sync))
        except (ConfigError, HydraException, OmegaConfBaseException) as e:
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise SystemExit(f"python -m ddp_lab.tools.bench.time_to_accuracy: --strategies {strategy}: "
                             f"{msg}") from None


def curve(run_dir: Path, figure: str) -> list[tuple[float, float]]:
    """(seconds since the first step, value) of every evaluation of a run (TensorBoard's by_time/)."""
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0}).Reload()
    return [(e.step / 1000, e.value) for e in acc.Scalars(f"by_time/{figure}")]


def plot(curves: dict[str, list[list]], figure: str, target: float, out: Path) -> None:
    """Each strategy's curves (one per seed) in one colour."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (name, runs) in enumerate(curves.items()):
        for j, points in enumerate(runs):
            ax.plot([t for t, _ in points], [v for _, v in points], marker=".", color=f"C{i}",
                    label=name if j == 0 else None, alpha=1.0 if len(runs) == 1 else 0.6)
    ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
    ax.set_xlabel("wall-clock seconds since the first step")
    ax.set_ylabel(figure.replace("_", " "))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    preflight(args)
    out = fresh_out_dir(args.out, "outputs/bench/time_to_accuracy")
    world = args.hosts * args.nproc_per_host if args.hosts else args.ranks
    figure = "acc_test" if args.target_acc is not None else "loss_val"
    headline = "test_acc" if args.target_acc is not None else "val_loss"
    rows, curves = [], {}
    with contextlib.ExitStack() as stack:
        cluster = None
        if args.hosts is not None:
            from ddp_lab.tools.cluster import emulated
            cluster = stack.enter_context(emulated(args.hosts, args.rate, f"race{os.getpid()}"))
        for seed in args.seeds:  # interleaved: a slow spell of the machine hits every strategy alike
            for strategy in args.strategies:
                name = re.sub(r"[^\w.-]", "_", strategy)  # (Hydra parses the dir's "=")
                run_dir = out / "runs" / (name if seed is None else f"{name}/seed{seed}")
                try:
                    s = run_trainer(args.hosts or world, run_overrides(strategy, seed, args), run_dir, args.timeout,
                                    cluster, args.nproc_per_host)
                except RuntimeError as e:  # the divergence guard stopped it: a target missed, the race goes on
                    if "training diverged" not in str(e):
                        raise
                    rows.append(diverged(strategy, seed, world, args.target_acc if args.target_acc is not None
                                         else args.target_loss, str(e)))
                    print(f"  {strategy:10s} seed {fmt(seed):4s} diverged at step "
                          f"{fmt(rows[-1]['diverged_at_step'])}: no target", flush=True)
                    continue
                if "val_loss" not in s and headline == "val_loss":  # a classification run's loss is test_loss
                    headline, figure = "test_loss", "loss_test"
                rows.append(row(strategy, seed, s, _every(run_dir), headline))
                curves.setdefault(strategy, []).append(curve(run_dir, figure))
                print(f"  {strategy:10s} seed {fmt(seed):4s} {s['sync']:40s} target at step "
                      f"{fmt(s['steps_to_target'])}, {fmt(s['time_to_target_s'], '.1f')} s; "
                      f"{s['wire_bytes_per_step']:,.0f} B/step; final {s[headline]:.4f}", flush=True)
    compare(rows)
    if args.fit is not None:
        from ddp_lab.tools.costmodel.strategies import predict_rows
        predict_rows(rows, args.fit, args.steps_from, args.loopback_fit, args.fit_across)
        if args.rate is not None:
            (out / "by_rate.md").write_text(rates_table(args, world))
    with open(out / "race.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows({k: r.get(k) for k in COLUMNS} for r in rows)
    groups = by_strategy(rows)
    table = (summary_markdown(groups) + "\nEvery run:\n\n" if len(args.seeds) > 1 else "") + markdown(rows)
    (out / "race.md").write_text(table)
    plot(curves, figure, rows[0]["target"], out / "race.png")
    write_record(out, command_line("ddp_lab.tools.bench.time_to_accuracy", sys.argv[1:] if argv is None else argv),
                 {"world_size": world, "emulated_hosts": args.hosts is not None, "link_rate": args.rate,
                  "nproc_per_host": args.nproc_per_host,
                  "fit_across": str(args.fit_across) if args.fit_across else None,
                  "strategies": args.strategies, "seeds": args.seeds, "epochs": args.epochs,
                  "eval_every": args.eval_every, "stop_at_target": args.stop_at_target,
                  "fit": str(args.fit) if args.fit else None,
                  "loopback_fit": str(args.loopback_fit) if args.loopback_fit else None,
                  "steps_from": str(args.steps_from) if args.steps_from else None})
    print(table)
    print(f"written: {out / 'race.csv'}, {out / 'race.md'}, {out / 'race.png'}, {out / 'record.json'}")
    return rows


RATES = ("10mbit", "100mbit", "1gbit", "10gbit")


def rates_table(args, world: int) -> str:
    """The cost model's time to target of each strategy at other rates (by_rate.md): where each pays."""
    from ddp_lab.tools.cluster.shaping import parse_rate
    from ddp_lab.tools.costmodel.step_time import load_fit
    from ddp_lab.tools.costmodel.strategies import by_rate, loopback_rows

    loopback = {}  # strategy -> its runs (one per seed)
    for (name, _), r in loopback_rows(args.steps_from).items():
        if name in args.strategies:
            loopback.setdefault(name, []).append(r)
    local = load_fit(args.loopback_fit)["builtin"] if args.loopback_fit else None
    across = load_fit(args.fit_across)["builtin"] if args.fit_across else None
    seconds = by_rate(loopback, load_fit(args.fit)["builtin"], parse_rate(args.rate), world,
                      [parse_rate(r) for r in RATES], local, across)
    where = f"{args.hosts} hosts" + (f" of {args.nproc_per_host} ranks" if args.nproc_per_host > 1 else "")
    lines = [f"Predicted seconds to the target on {where} (x DDP's in brackets), from the loopback "
             f"race {args.steps_from} (the median over its seeds) and the {args.rate} link's fit {args.fit}, "
             "its seconds per byte scaled by rate:", "",
             "| strategy | " + " | ".join(RATES) + " |", "|---|" + "---:|" * len(RATES)]
    ddp = seconds.get("ddp")
    for name, values in seconds.items():
        cells = [f"{v:.0f}" + (f" ({v / d:.2f})" if ddp and d else "") if v else "-"
                 for v, d in zip(values, ddp or [None] * len(values))]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _every(run_dir: Path) -> int:
    """Steps between synchronisations of a run (1 but for local_sgd and diloco), from its config."""
    sync = OmegaConf.load(run_dir / ".hydra" / "config.yaml").sync
    return int(sync.get("every", 1))  # (only the periodic strategies have the key)


def command() -> None:
    """The `ddp-lab-bench-time-to-accuracy` command (pyproject.toml's [project.scripts]): main(), its rows kept
    back, since a console script exits with what its function returns."""
    main()


if __name__ == "__main__":
    main()
