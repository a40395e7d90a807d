"""How a job fails: the time from each injected fault to the last rank's exit, and what it says.

    python -m ddp_lab.tools.bench.fault_drill                        # every fault, 2 ranks
    python -m ddp_lab.tools.bench.fault_drill --kinds hang,kill --timeout-s 30 --out DIR

Each fault of FAULTS below (a DDP_LAB_FAULT of ddp_lab.guards.faults, at a
step and maybe in a phase) is injected into rank 1 of a short 2-rank run on
synthetic data (64 steps, one epoch); the clock starts at the fault's own
line on stderr (or, for kind=nan, at the start of the step it poisons) and
stops when torchrun has exited. The table gives the seconds, the exit status and
the first line each rank said (`ddp_lab: ...`). The runs, their raw lines
(<kind>.log), results.json and a record.json (ddp_lab.telemetry.provenance) go
to --out DIR (default outputs/bench/faults/<time>/).

Also: with --overhead, the per-call cost of the watchdog's marks
(`position.collective`) and of publishing a place to a TCP store.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from ddp_lab.telemetry.provenance import command_line, write_record
from ddp_lab.tools.bench import fresh_out_dir
from ddp_lab.tools.bench.trainer_runs import free_port

# name: (DDP_LAB_FAULT without rank=, extra overrides). Step 64 is the epoch's last:
# its evaluation and the epoch-end checkpoint follow it.
FAULTS = {
    "raise": ("step=5,kind=raise", []),
    "kill": ("step=5,kind=kill", []),
    "hang": ("step=5,kind=hang", []),
    "mismatch": ("step=5,kind=mismatch", []),
    "nan": ("step=5,kind=nan", []),
    "term": ("step=5,kind=term", []),  # a preemption: the save on the way out
    "stop": ("step=5,kind=stop", []),
    "stop@compile": ("step=1,kind=stop,phase=compile", ["trainer.compile=true"]),
    "stop@evaluation": ("step=64,kind=stop,phase=evaluation", []),
    "stop@checkpoint": ("step=64,kind=stop,phase=checkpoint step-64: writing", []),
    "hang@data": ("step=5,kind=hang,phase=data loading", []),
}
KINDS = tuple(FAULTS)


def run_fault(kind: str, run_dir: Path, timeout_s: float) -> dict:
    """One 2-rank run with FAULTS[kind] on rank 1; its timings."""
    fault, overrides = FAULTS[kind]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
           "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{free_port()}",
           "-m", "ddp_lab.train", "data=synthetic", "data.num_train=4096", "data.num_test=256",
           "data.batch_size=64", "trainer.epochs=1", "trainer.progress=false",
           f"dist.timeout_s={timeout_s}", f"dist.stall_warn_s={max(1.0, timeout_s / 4)}",
           f"hydra.run.dir={run_dir}", *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "DDP_LAB_FAULT": f"rank=1,{fault}"}
    lines: list[tuple[float, str]] = []
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    reader = threading.Thread(target=lambda: [lines.append((time.monotonic(), ln.rstrip()))
                                              for ln in proc.stdout], daemon=True)
    reader.start()
    rc = proc.wait(timeout=timeout_s * 4 + 300)
    end = time.monotonic()
    reader.join(5)
    marker = "DDP_LAB_FAULT" if kind != "nan" else "step 5"
    fault_at = next((t for t, ln in lines if marker in ln and "ddp_lab:" not in ln), None)
    if kind == "nan":  # no line of its own: the step before it ends with a checkpoint-free log
        fault_at = next((t for t, ln in lines if "training diverged" in ln), None)
    said = [ln for _, ln in lines if ln.startswith("ddp_lab:")]
    said += [ln.split(" - ", 1)[-1] for _, ln in lines if "saved checkpoint" in ln]  # term
    return {"kind": kind, "exit_status": rc, "total_s": round(end - start, 1),
            "fault_to_exit_s": None if fault_at is None else round(end - fault_at, 1),
            "said": said[:4], "lines": [ln for _, ln in lines]}


def overhead(repeats: int = 7) -> dict:
    """Median per-call seconds of a collective() mark, and of one store.set of a place."""
    import torch.distributed as dist  # torch only here: the runs are subprocesses

    from ddp_lab.telemetry import position

    def per_call(fn, n):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n

    def mark():
        with position.collective("gradient sync"):
            pass

    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, 1, is_master=True,  # noqa: F841  (kept alive)
                           timeout=datetime.timedelta(seconds=10))
    client = dist.TCPStore("127.0.0.1", port, 1, is_master=False,
                           timeout=datetime.timedelta(seconds=10))
    place = json.dumps(position.HERE.as_dict())
    marks = [per_call(mark, 100_000) for _ in range(repeats)]
    sets = [per_call(lambda: client.set("place/0", place), 2_000) for _ in range(repeats)]
    return {"collective_mark_s": statistics.median(marks), "store_set_s": statistics.median(sets),
            "repeats": repeats}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ddp_lab.tools.bench.fault_drill", description=__doc__.split("\n")[0])
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    p.add_argument("--timeout-s", type=float, default=20, help="dist.timeout_s of the runs")
    p.add_argument("--out", type=Path, default=None, help="a new folder for the results and record.json")
    p.add_argument("--overhead", action="store_true", help="also time the watchdog's marks")
    args = p.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        p.error(f"--kinds: {', '.join(bad)} not among {', '.join(KINDS)}")
    work = fresh_out_dir(args.out, "outputs/bench/faults")
    results = [run_fault(k, work / f"run-{k}", args.timeout_s) for k in kinds]
    print(f"| kind | exit | fault to last exit (s) | first line said (dist.timeout_s={args.timeout_s:g}) |")
    print("|---|---|---|---|")
    for r in results:
        first = r["said"][0][:110] if r["said"] else ""
        print(f"| {r['kind']} | {r['exit_status']} | {r['fault_to_exit_s']} | {first} |")
    extra = {"results": [{k: v for k, v in r.items() if k != "lines"} for r in results]}
    if args.overhead:
        extra["overhead"] = o = overhead()
        print(f"position.collective() mark: {o['collective_mark_s'] * 1e6:.1f} us; "
              f"publishing a place (TCPStore.set): {o['store_set_s'] * 1e6:.1f} us (medians)")
    for r in results:
        (work / f"{r['kind']}.log").write_text("\n".join(r["lines"]) + "\n")
    (work / "results.json").write_text(json.dumps(extra, indent=2) + "\n")
    write_record(work, command_line("ddp_lab.tools.bench.fault_drill", sys.argv[1:] if argv is None else argv), extra)
    print(f"# wrote {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
