"""The trainer against a d2l baseline, on the same machine, data and epochs.

    # the headline results (docs/results/README.md): d2l's LeNet from scratch vs the trainer on 2 ranks
    python -m ddp_lab.tools.bench.vs_baseline --epochs 10 --repeats 3
    # the same with more trainer rows: torch.compile off (auto compiles 10 epochs), and the
    # trainer at the baseline's global batch (256, with its own lr per image: 0.1 per 256)
    python -m ddp_lab.tools.bench.vs_baseline --epochs 10 --repeats 3 --variant eager=trainer.compile=false \
        --variant b256="data.batch_size=256 optim.lr=0.1"
    # a quick sanity check (minutes, not a measurement)
    python -m ddp_lab.tools.bench.vs_baseline --epochs 1 --repeats 1
    # scaling: the trainer on 1 and on 2 processes, 256 images and 1 thread per process
    python -m ddp_lab.tools.bench.vs_baseline --compare-world 1,2 --per-process-batch 256 --threads 1 \
        --epochs 3 --repeats 3 --trainer-args trainer.compile=true
    # d2l's ResNet-18 in nn.DataParallel vs the trainer with ResNet-18 (a GPU machine: 1 process per GPU)
    python -m ddp_lab.tools.bench.vs_baseline --baseline data_parallel --nproc 2 --epochs 10 --repeats 3
    # 10-epoch rounds on a shared machine: hold the shared lock for one run at a time
    python -m ddp_lab.tools.bench.vs_baseline --epochs 10 --repeats 3 --lock /tmp/ddp_lab_cpu.lock
    # re-render the table of an earlier run's results.json
    python -m ddp_lab.tools.bench.vs_baseline --table-only outputs/bench/vs_baseline/<stamp>

Every run is a subprocess of its own: the baseline as `python -m
ddp_lab.tools.baselines.<name>`, the trainer as `python -m torch.distributed.run
--standalone --nproc_per_node=N -m ddp_lab.train`. Runs alternate (baseline,
trainer, baseline, trainer, ...) so that a change in machine load hits both
systems alike; each writes summary.json into <out>/runs/<system>-<repeat>/,
which is where images/s, sec/epoch, test accuracy and peak_mem_mb come from:
  images/s      after the first warm-up steps, evaluation left out (both systems alike)
  MFU           model FLOPs utilisation: training FLOPs per image x images/s over the
                measured float32 (or bf16) matmul peak of the cores the run used; the
                trainer's from its summary.json, the baseline's computed here from its
                network and images/s with the same counter and peak (ddp_lab.telemetry.mfu)
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

Both systems see the same data (data.root, or found as ddp_lab.training.data finds it)
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
import json
import subprocess
import sys
from pathlib import Path

from ddp_lab.telemetry.provenance import command_line, write_record
from ddp_lab.tools.bench import fresh_out_dir
from ddp_lab.tools.bench.vs_baseline.baseline_mfu import with_mfu
from ddp_lab.tools.bench.vs_baseline.runs import TRAINER_MODEL, holding, plan, run_one
from ddp_lab.tools.bench.vs_baseline.table import notes_for, summarize, write_outputs


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m ddp_lab.tools.bench.vs_baseline",
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
    p.add_argument("--data-root", default=None, help="Fashion-MNIST folder (default: found as the trainer finds it)")
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
    p.add_argument("--lock", type=Path, default=None, metavar="FILE",
                   help="hold an flock on FILE during each run (and its MFU's peak measurement), "
                        "releasing it between runs, e.g. /tmp/ddp_lab_cpu.lock on a shared machine")
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
                with holding(a.lock):
                    result = run_one(system, repeat, command(run_dir), run_dir, a.timeout)
                    if slug == "baseline":  # the trainer's summary.json has its own
                        result = with_mfu(result, a.baseline, a.baseline_threads)
                results.append(result)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        failed = e
    (a.out / "results.json").write_text(json.dumps(
        {"args": args_record, "reference": reference, "results": results}, indent=2) + "\n")
    write_record(a.out, command_line("ddp_lab.tools.bench.vs_baseline", sys.argv[1:] if argv is None else argv),
                 {"runs": len(results), "failed": failed is not None})
    if failed is not None:
        print(f"vs_baseline: {failed}", file=sys.stderr)
    rows = summarize(results, reference) if any(r["system"] == reference for r in results) else []
    if rows:
        print()
        print(write_outputs(a.out, rows, notes_for(rows, results, a)), end="")
        print(f"\nwritten: {a.out / 'table.md'}, {a.out / 'table.csv'}, {a.out / 'results.json'}")
    return 1 if failed is not None else 0

