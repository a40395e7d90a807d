"""vs_baseline's runs: the command of each system, one run as a subprocess and its
summary.json, and the plan of which systems alternate in each round."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

# Per baseline: the trainer's model overrides that make it the same network. For d2l's
# LeNet that is the trainer's default, lenet_fast: the same layers, weights and logits
# as model=lenet, with less arithmetic (conf/model/lenet_fast.yaml).
TRAINER_MODEL = {
    "d2l_scratch": ["model=lenet_fast"],
    "data_parallel": ["model=resnet18", "model.init=d2l"],
}


def baseline_command(name: str, run_dir: Path, a) -> list[str]:
    args = [f"hydra.run.dir={run_dir}", f"epochs={a.epochs}", f"data.batch_size={a.batch}",
            f"threads={a.baseline_threads}", f"max_steps={a.max_steps}"]
    if a.data_root:
        args.append(f"data.root={a.data_root}")
    return [sys.executable, "-m", f"ddp_lab.tools.baselines.{name}", *args, *shlex.split(a.baseline_args)]


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
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout, env=env)
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


@contextlib.contextmanager
def holding(lock_path: Path | None):
    """Hold an exclusive flock on lock_path (None: nothing) for the block: one run at a
    time, with the machine free for other jobs between runs."""
    if lock_path is None:
        yield
        return
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


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

