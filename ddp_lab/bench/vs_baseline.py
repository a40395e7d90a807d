"""The trainer against a d2l baseline, on the same machine, data and epochs.

    # the README table: d2l's LeNet from scratch vs `torchrun --nproc_per_node=2 -m ddp_lab.train`
    python -m ddp_lab.bench.vs_baseline --epochs 10 --repeats 3
    # the same with more trainer rows: torch.compile off (auto compiles 10 epochs), and the
    # trainer at the baseline's global batch (256, with its own lr per image: 0.1 per 256)
    python -m ddp_lab.bench.vs_baseline --epochs 10 --repeats 3 --variant eager=trainer.compile=false \
        --variant b256="data.batch_size=256 optim.lr=0.1"
    # a quick sanity check (minutes, not a measurement)
    python -m ddp_lab.bench.vs_baseline --epochs 1 --repeats 1
    # scaling: the trainer on 1 and on 2 processes, 256 images and 1 thread per process
    python -m ddp_lab.bench.vs_baseline --compare-world 1,2 --per-process-batch 256 --threads 1 \
        --epochs 3 --repeats 3 --trainer-args trainer.compile=true
    # d2l's ResNet-18 in nn.DataParallel vs the trainer with ResNet-18 (a GPU machine: 1 process per GPU)
    python -m ddp_lab.bench.vs_baseline --baseline data_parallel --nproc 2 --epochs 10 --repeats 3
    # re-render the table of an earlier run's results.json
    python -m ddp_lab.bench.vs_baseline --table-only outputs/bench/vs_baseline/<stamp>

Every run is a subprocess of its own: the baseline as `python -m
ddp_lab.baselines.<name>`, the trainer as `python -m torch.distributed.run
--standalone --nproc_per_node=N -m ddp_lab.train`. Runs alternate (baseline,
trainer, baseline, trainer, ...) so that a change in machine load hits both
systems alike; each writes summary.json into <out>/runs/<system>-<repeat>/,
which is where images/s, sec/epoch, test accuracy and peak_mem_mb come from:
  images/s      after the first warm-up steps, evaluation left out (both systems alike)
  sec/epoch     wall time of the training loop per epoch (d2l's timer; evaluation left out)
  peak mem      peak RSS of one process (rank 0 for the trainer; on GPU: max CUDA memory allocated)
The table gives the median over repeats of each, min and max of images/s, and
the ratio of medians to the baseline's (or, with --compare-world, to the
smallest world size's). --compare-world also reports the scaling efficiency
rate(N processes) / (N/M x rate(M processes)), with the per-process batch and
threads held fixed. The notes under the table also give the ratio (or the
efficiency) within each round, a run against the other system's run of the
same round, and their median: how much the ratio itself varies from round to
round, each pair of runs having seen nearly the same machine.

Both systems see the same data (data.root, or found as ddp_lab.data finds it)
and the same number of epochs. Each keeps its own recipe: the baseline d2l's
(global batch 256, plain SGD, d2l's lr), the trainer its config
(conf/train.yaml: global batch 512, SGD with Nesterov momentum, cosine
schedule; bf16 autocast and channels_last where the CPU runs bf16 natively;
torch.compile for runs this long). The table shows each row's global batch;
--trainer-batch sets the trainer's (with --trainer-args optim.lr=... to keep
0.1 per 256 images). Add overrides to either with --trainer-args /
--baseline-args; --variant adds trainer rows with other settings.

Output (<out> = outputs/bench/vs_baseline/<time> unless --out): results.json
(one record per run), table.md, table.csv, and the same table on stdout.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from ddp_lab.bench import fresh_out_dir
from ddp_lab.provenance import command_line, write_record

# Per baseline: the trainer's model overrides that make it the same network.
TRAINER_MODEL = {
    "d2l_scratch": ["model=lenet"],
    "data_parallel": ["model=resnet18", "model.init=d2l"],
}
COLUMNS = ["system", "runs", "global_batch", "images_per_sec_median", "images_per_sec_min",
           "images_per_sec_max", "sec_per_epoch", "test_acc", "peak_mem_mb_per_process", "ratio"]
HEADERS = ["system", "runs", "global batch", "images/s (median)", "min", "max", "sec/epoch",
           "test acc", "peak mem/process (MiB)", "ratio"]


# ---------------------------------------------------------------- the table (pure)
def summarize(results: list[dict], reference: str | None = None) -> list[dict]:
    """One row per system, in order of first appearance; `ratio` is relative to `reference`.

    Each result holds at least system, samples_per_sec, sec_per_epoch, test_acc
    and peak_mem_mb (None where not measured), and global_batch where known.
    reference defaults to the first system.
    """
    systems: dict[str, list[dict]] = {}
    for r in results:
        systems.setdefault(r["system"], []).append(r)
    if not systems:
        return []
    reference = reference or next(iter(systems))
    if reference not in systems:
        raise ValueError(f"reference system {reference!r} has no results; have {', '.join(systems)}")

    def median(runs, key):
        vals = [r[key] for r in runs if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    ref_rate = median(systems[reference], "samples_per_sec")
    rows = []
    for name, runs in systems.items():
        rates = [r["samples_per_sec"] for r in runs]
        mems = [r["peak_mem_mb"] for r in runs if r.get("peak_mem_mb") is not None]
        rate = statistics.median(rates)
        batches = sorted({r["global_batch"] for r in runs if r.get("global_batch") is not None})
        rows.append({
            "system": name, "runs": len(runs),
            "global_batch": "/".join(str(b) for b in batches) or None,
            "images_per_sec_median": rate, "images_per_sec_min": min(rates),
            "images_per_sec_max": max(rates),
            "sec_per_epoch": median(runs, "sec_per_epoch"),
            "test_acc": median(runs, "test_acc"),
            "peak_mem_mb_per_process": max(mems) if mems else None,
            "ratio": rate / ref_rate if ref_rate else None,
        })
    return rows


def scaling_efficiency(results: list[dict], small: str, large: str,
                       small_world: int, large_world: int) -> float:
    """rate(large) / (large_world / small_world * rate(small)), medians over repeats."""
    rate = {name: statistics.median([r["samples_per_sec"] for r in results if r["system"] == name])
            for name in (small, large)}
    return rate[large] / (large_world / small_world * rate[small])


def paired_ratios(results: list[dict], system: str, reference: str) -> list[float]:
    """rate(system) / rate(reference) within each round (runs of the same repeat), in
    round order. The runs of a round follow each other, so each ratio compares two runs
    that saw nearly the same machine; rounds missing either system are left out."""
    ref = {r["repeat"]: r["samples_per_sec"] for r in results if r["system"] == reference}
    mine = sorted((r["repeat"], r["samples_per_sec"]) for r in results
                  if r["system"] == system and r.get("repeat") in ref)
    return [rate / ref[repeat] for repeat, rate in mine]


def _per_round(values: list[float], show: Callable[[float], str]) -> str:
    """' Per round: a, b, c; median m.' for two or more rounds, else ''."""
    if len(values) < 2:
        return ""
    return f" Per round: {', '.join(map(show, values))}; median {show(statistics.median(values))}."


def _fmt(key: str, v) -> str:
    if v is None:
        return "-"
    if key.startswith("images_per_sec"):
        return f"{v:,.0f}"
    if key == "sec_per_epoch":
        return f"{v:.1f}"
    if key == "test_acc":
        return f"{v:.4f}"
    if key == "peak_mem_mb_per_process":
        return f"{v:,.0f}"
    if key == "ratio":
        return f"{v:.2f}x"
    return str(v)


def markdown_table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |",
             "|" + "|".join(["---"] + ["---:"] * (len(HEADERS) - 1)) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(k, row[k]) for k in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def csv_text(rows: list[dict]) -> str:
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for row in rows:
        w.writerow({k: ("" if row[k] is None else row[k]) for k in COLUMNS})
    return out.getvalue()


def report_text(rows: list[dict], notes: list[str]) -> str:
    return markdown_table(rows) + "".join(f"\n{n}" for n in notes) + ("\n" if notes else "")


# ---------------------------------------------------------------- the runs
def baseline_command(name: str, run_dir: Path, a) -> list[str]:
    args = [f"hydra.run.dir={run_dir}", f"epochs={a.epochs}", f"data.batch_size={a.batch}",
            f"threads={a.baseline_threads}", f"max_steps={a.max_steps}"]
    if a.data_root:
        args.append(f"data.root={a.data_root}")
    return [sys.executable, "-m", f"ddp_lab.baselines.{name}", *args, *shlex.split(a.baseline_args)]


def trainer_command(nproc: int, batch: int | None, run_dir: Path, a, extra: str = "") -> list[str]:
    """batch None: the trainer's own default (conf/data)."""
    args = [f"hydra.run.dir={run_dir}", f"trainer.epochs={a.epochs}",
            *([] if batch is None else [f"data.batch_size={batch}"]),
            f"trainer.threads={a.threads}", f"trainer.max_steps={a.max_steps}",
            "trainer.progress=false", *TRAINER_MODEL[a.baseline]]
    if a.data_root:
        args.append(f"data.root={a.data_root}")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "ddp_lab.train", *args, *shlex.split(a.trainer_args), *shlex.split(extra)]


def run_one(system: str, repeat: int, cmd: list[str], run_dir: Path, timeout: float | None) -> dict:
    print(f"[{system} #{repeat + 1}] {shlex.join(cmd)}", flush=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    wall = time.perf_counter() - t0
    (run_dir.parent / f"{run_dir.name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
        raise RuntimeError(f"{system} #{repeat + 1} failed (exit {proc.returncode}); "
                           f"log: {run_dir.parent / (run_dir.name + '.log')}\n{tail}")
    summary = json.loads((run_dir / "summary.json").read_text())
    result = {"system": system, "repeat": repeat, "wall_s": wall, "run_dir": str(run_dir), **summary}
    print(f"    {summary['samples_per_sec']:,.0f} img/s, {summary['sec_per_epoch']:.1f} s/epoch, "
          f"test acc {summary['test_acc']:.4f}, peak {summary.get('peak_mem_mb') or 0:,.0f} MiB/process",
          flush=True)
    return result


def plan(a) -> tuple[list[tuple[str, str, Callable[[Path], list[str]]]], str]:
    """(system, run-dir slug, command for a run dir) per system, in the order they alternate;
    and the reference system."""
    if a.compare_world:
        worlds = parse_worlds(a.compare_world)
        return [(f"trainer {w}p", f"trainer-{w}p",
                 lambda d, w=w: trainer_command(w, a.per_process_batch * w, d, a))
                for w in worlds], f"trainer {worlds[0]}p"
    base = f"baseline {a.baseline}"
    systems = [(base, "baseline", lambda d: baseline_command(a.baseline, d, a)),
               (f"trainer {a.nproc}p", "trainer", lambda d: trainer_command(a.nproc, a.trainer_batch, d, a))]
    for label, overrides in parse_variants(a.variant):
        systems.append((f"trainer {a.nproc}p {label}", f"trainer-{label}",
                        lambda d, o=overrides: trainer_command(a.nproc, a.trainer_batch, d, a, o)))
    return systems, base


def parse_variants(specs: list[str]) -> list[tuple[str, str]]:
    """--variant LABEL=OVERRIDES: e.g. 'compile=trainer.compile=true' -> ('compile', 'trainer.compile=true')."""
    out = []
    for spec in specs:
        label, sep, overrides = spec.partition("=")
        if not sep or not label or not overrides or not label.replace("_", "").replace("-", "").isalnum():
            raise SystemExit(f"--variant {spec!r}: expected LABEL=OVERRIDES, e.g. compile=trainer.compile=true")
        out.append((label, overrides))
    return out


def parse_worlds(text: str) -> list[int]:
    try:
        worlds = sorted({int(w) for w in text.split(",")})
    except ValueError:
        worlds = []
    if len(worlds) < 2 or worlds[0] < 1:
        raise SystemExit(f"--compare-world={text!r}: give two or more world sizes >= 1, e.g. 1,2")
    return worlds


def notes_for(rows: list[dict], results: list[dict], a) -> list[str]:
    if not rows:
        return []
    if a.compare_world:
        worlds = parse_worlds(a.compare_world)
        small = f"trainer {worlds[0]}p"
        out = []
        for w in worlds[1:]:
            large = f"trainer {w}p"
            eff = scaling_efficiency(results, small, large, worlds[0], w)
            rounds = [x / (w / worlds[0]) for x in paired_ratios(results, large, small)]
            out.append(f"Scaling efficiency: rate({w}p) / ({w / worlds[0]:g} x rate({worlds[0]}p)) = {eff:.1%} "
                       f"({a.per_process_batch} images and {a.threads or 'default'} thread(s) per process)."
                       + _per_round(rounds, lambda v: f"{v:.1%}"))
        return out
    base, out = rows[0], []
    for trainer in rows[1:]:
        acc = ""
        if base["test_acc"] is not None and trainer["test_acc"] is not None:
            acc = f", test accuracy {trainer['test_acc'] - base['test_acc']:+.4f}"
        name = "Trainer" if len(rows) == 2 else trainer["system"]
        batches = f"global batch {trainer['global_batch'] or '?'} against {base['global_batch'] or '?'}"
        rounds = paired_ratios(results, trainer["system"], base["system"])
        out.append(f"{name} / baseline: {trainer['ratio']:.2f}x images/s{acc} "
                   f"(medians of {trainer['runs']} run(s), {a.epochs} epoch(s), {batches})."
                   + _per_round(rounds, lambda v: f"{v:.2f}x"))
    return out


def write_outputs(out: Path, rows: list[dict], notes: list[str]) -> str:
    text = report_text(rows, notes)
    (out / "table.md").write_text(text)
    (out / "table.csv").write_text(csv_text(rows))
    return text


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m ddp_lab.bench.vs_baseline",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", choices=sorted(TRAINER_MODEL), default="d2l_scratch",
                   help="which d2l system to compare with (default: d2l_scratch, LeNet)")
    p.add_argument("--epochs", type=int, default=10, help="epochs per run, both systems (default: 10)")
    p.add_argument("--repeats", type=int, default=3, help="runs per system, alternating (default: 3)")
    p.add_argument("--nproc", type=int, default=2, help="trainer processes, torchrun --nproc_per_node (default: 2)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per trainer process (default: 1; 0: torch's default)")
    p.add_argument("--baseline-threads", type=int, default=0,
                   help="torch threads of the baseline's one process (default: 0, torch's default: every core)")
    p.add_argument("--batch", type=int, default=256,
                   help="the baseline's global batch (default: 256, the chapter's)")
    p.add_argument("--trainer-batch", type=int, default=None,
                   help="the trainer's global batch (default: its own, data.batch_size in conf/data; "
                        "--trainer-batch 256 compares at the baseline's)")
    p.add_argument("--max-steps", type=int, default=0, help="cap each run at this many steps (0: none)")
    p.add_argument("--data-root", default=None, help="Fashion-MNIST folder (default: found as ddp_lab.data does)")
    p.add_argument("--trainer-args", default="", help="extra Hydra overrides for the trainer, one string")
    p.add_argument("--baseline-args", default="", help="extra Hydra overrides for the baseline, one string")
    p.add_argument("--variant", action="append", default=[], metavar="LABEL=OVERRIDES",
                   help="one more trainer row with these extra overrides, e.g. "
                        "'compile=trainer.compile=true' (repeatable)")
    p.add_argument("--compare-world", default="",
                   help="instead of a baseline: the trainer at these world sizes, e.g. 1,2")
    p.add_argument("--per-process-batch", type=int, default=256,
                   help="with --compare-world: images per process per step (default: 256, the "
                        "trainer's default global batch 512 on 2 ranks)")
    p.add_argument("--timeout", type=float, default=None, help="seconds one run may take (default: no limit)")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: outputs/bench/vs_baseline/<time>)")
    p.add_argument("--table-only", type=Path, default=None, metavar="DIR",
                   help="re-render DIR/results.json into DIR/table.md and table.csv; run nothing")
    a = p.parse_args(argv)
    if a.repeats < 1 or a.epochs < 1 or a.nproc < 1:
        p.error("--repeats, --epochs and --nproc must be >= 1")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.table_only:
        path = a.table_only / "results.json"
        if not path.is_file():
            raise SystemExit(f"--table-only {a.table_only}: no results.json there; give the "
                             "folder a vs_baseline run wrote (its --out)")
        saved = json.loads(path.read_text())
        a_saved = argparse.Namespace(**{**vars(a), **saved["args"]})
        rows = summarize(saved["results"], saved["reference"])
        print(write_outputs(a.table_only, rows, notes_for(rows, saved["results"], a_saved)), end="")
        return 0
    a.out = fresh_out_dir(a.out, "outputs/bench/vs_baseline")
    (a.out / "runs").mkdir()
    systems, reference = plan(a)
    results: list[dict] = []
    args_record = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}
    failed = None
    try:
        for repeat in range(a.repeats):
            for system, slug, command in systems:
                run_dir = a.out / "runs" / f"{slug}-{repeat + 1}"
                results.append(run_one(system, repeat, command(run_dir), run_dir, a.timeout))
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        failed = e
    (a.out / "results.json").write_text(json.dumps(
        {"args": args_record, "reference": reference, "results": results}, indent=2) + "\n")
    write_record(a.out, command_line("ddp_lab.bench.vs_baseline", sys.argv[1:] if argv is None else argv),
                 {"runs": len(results), "failed": failed is not None})
    if failed is not None:
        print(f"vs_baseline: {failed}", file=sys.stderr)
    rows = summarize(results, reference) if any(r["system"] == reference for r in results) else []
    if rows:
        print()
        print(write_outputs(a.out, rows, notes_for(rows, results, a)), end="")
        print(f"\nwritten: {a.out / 'table.md'}, {a.out / 'table.csv'}, {a.out / 'results.json'}")
    return 1 if failed is not None else 0


if __name__ == "__main__":
    sys.exit(main())
