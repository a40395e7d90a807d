"""Hosts lost again and again: torchft islands against checkpoint-restart on the islands race's GPT.

3 emulated hosts of one rank at 100 Mbit/s, DiLoCo across (sync.every=8, fp32), 240 steps, a checkpoint every
48, evaluated every 24 (target: validation loss 2.93, noted, not stopping the run). Both wait 10 s for a lost peer
in a collective (dist.timeout_s, sync.island_timeout_s) before they act. From the launch, every
KILL_EVERY s a host is lost at once (`cluster kill`, hosts 1 and 2 in turn; host 0 runs the Lighthouse):
  torchft  sync.fault_tolerance=torchft: the others go on; `cluster run --rejoin-after-s DELAY` starts the lost
           host again, which resumes its own checkpoint and is healed from a peer
  restart  the same job without torchft: it fails, and is launched again DELAY s later with trainer.resume=auto
           (every host from its newest checkpoint), as a scheduler would, until it ends
and both without losses (the controls). REPS rounds (seed = round), the four runs interleaved in each. Each run
appends a JSON line to runs.jsonl (wall time, kills, launches, membership, the validation curve against the
wall time since the first launch); the runs' logs stay in a temporary folder (printed at the end), from which
`table.py --events` keeps the lines that time each recovery (events.txt); table.py makes the tables, the
cost model's predictions and the plot.
Usage (from the repository root, as root): [VENV=.venv] python <this folder>/run.py [REPS [KILL_EVERY [DELAY]]]
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

HERE = Path(__file__).parent
PY = os.path.join(os.environ.get("VENV", ".venv"), "bin", "python")
REPS, KILL_EVERY, DELAY = (int(sys.argv[1]) if len(sys.argv) > 1 else 3,
                           float(sys.argv[2]) if len(sys.argv) > 2 else 45.0,
                           float(sys.argv[3]) if len(sys.argv) > 3 else 3.0)
NAME = "rl"
COMMON = ["-m", "ddp_lab.train", "model=gpt", "data=text", "optim=adamw", "data.batch_size=96",
          "data.val_fraction=0.02", "sync=diloco", "sync.islands=host", "sync.every=8", "trainer.max_steps=240",
          "trainer.eval_every_steps=24", "trainer.target_loss=2.93", "trainer.stop_at_target=false",
          "trainer.ckpt_every_steps=48", "trainer.progress=false", "dist.timeout_s=10"]
FT = ["sync.fault_tolerance=torchft", "sync.max_islands=3", "sync.island_timeout_s=10"]


def cluster(*args) -> list[str]:
    return [PY, "-m", "ddp_lab.tools.cluster", args[0], "--name", NAME, *args[1:]]


def launch(cmd: list[str], log, t0: float) -> int:
    """Run cmd, each line of its output into log after the seconds since t0."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in p.stdout:
        log.write(f"{time.monotonic() - t0:8.2f} {line}")
    return p.wait()


def killer(t0: float, stop: threading.Event, kills: list) -> None:
    """Every KILL_EVERY s from t0, lose host 1, then 2, then 1..."""
    k = 1
    while not stop.wait(max(0.0, t0 + k * KILL_EVERY - time.monotonic())):
        host = f"{NAME}-{1 + (k - 1) % 2}"
        out = subprocess.run(cluster("kill", host), capture_output=True, text=True).stdout.strip()
        kills.append({"t": round(time.monotonic() - t0, 2), "host": host, "said": out})
        k += 1


def val_curve(tb: Path, epoch0: float) -> tuple[list, float | None]:
    """(wall s since the launch, step, validation loss) of every evaluation, and the first step's time."""
    acc = EventAccumulator(str(tb), size_guidance={"scalars": 0}, purge_orphaned_data=False).Reload()
    curve = [(round(e.wall_time - epoch0, 2), e.step, round(e.value, 4)) for e in acc.Scalars("loss/val")]
    steps = acc.Scalars("loss/train_step") if "loss/train_step" in acc.Tags()["scalars"] else []
    return curve, (round(min(e.wall_time for e in steps) - epoch0, 2) if steps else None)


def run(mode: str, kill: bool, rep: int, out: Path) -> None:
    d = out / f"{mode}-{int(kill)}-{rep}"
    seed = [f"seed={rep}"]
    t0, epoch0 = time.monotonic(), time.time()
    stop, kills, launches = threading.Event(), [], []
    if kill:
        threading.Thread(target=killer, args=(t0, stop, kills), daemon=True).start()
    with open(f"{d}.log", "w") as log:
        if mode == "torchft":
            launches.append(0.0)
            rc = launch(cluster("run", "--rejoin-after-s", str(DELAY), "--", *COMMON, *FT, *seed,
                                f"hydra.run.dir={d}/island${{oc.env:DDP_LAB_ISLAND}}"), log, t0)
        else:
            rc = 1
            while rc != 0 and len(launches) < 40:
                if launches:
                    time.sleep(DELAY)
                launches.append(round(time.monotonic() - t0, 2))
                again = ["trainer.resume=auto"] if len(launches) > 1 else []
                rc = launch(cluster("run", "--run-id", f"{d.name}-{len(launches)}", "--", *COMMON, *seed, *again,
                                    f"hydra.run.dir={d}"), log, t0)
    wall = time.monotonic() - t0
    stop.set()
    first = d / "island0" if mode == "torchft" else d  # (host 0: never lost)
    s = json.loads((first / "summary.json").read_text()) if (first / "summary.json").exists() else {}
    curve, first_step = val_curve(first / "tb", epoch0)
    text = Path(f"{d}.log").read_text()
    host0 = [ln.split()[0] for ln in text.splitlines() if f"[{NAME}-0]" in ln]
    said = lambda what: [float(ln.split()[0]) for ln in text.splitlines() if f"[{NAME}-0] {what}" in ln]  # noqa: E731
    row = {"mode": mode, "kill": kill, "rep": rep, "rc": rc, "wall_s": round(wall, 2),
           # host 0 (never lost) ended, and reached the target (the last time: a restart may reach it again)
           "done_s": float(host0[-1]) if host0 else None, "target_s": (said("target reached") or [None])[-1],
           "launches": launches,
           "kills": kills, "first_step_s": first_step, "steps": s.get("steps"),
           "steps_to_target": s.get("steps_to_target"), "val_loss": s.get("val_loss"),
           "membership": s.get("membership"), "rounds_dropped": s.get("rounds_dropped"),
           "restarts_by_rank": s.get("restarts_by_rank"), "step_ms": s.get("step_ms"),
           "train_s": s.get("train_s"), "curve": curve,
           "heals": [ln for ln in text.splitlines() if "rejoined from a peer island" in ln],
           "resumes": [ln for ln in text.splitlines() if "resumed from" in ln and f"[{NAME}-0]" in ln]}
    with open(HERE / "runs.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    print(f"{mode} kill={int(kill)} rep={rep}: rc {rc}, {wall:.1f} s, {len(kills)} kills, {len(launches)} "
          f"launch(es), steps to target {row['steps_to_target']}, val loss {row['val_loss']}", flush=True)


def main() -> None:
    out = Path(tempfile.mkdtemp(prefix="losses."))
    subprocess.run(cluster("down"), capture_output=True)
    with open(HERE / "cluster.txt", "w") as f:
        subprocess.run(cluster("up", "--hosts", "3", "--rate", "100mbit"), stdout=f, check=True)
    try:
        for rep in range(1, REPS + 1):
            for mode, kill in (("torchft", True), ("restart", True), ("torchft", False), ("restart", False)):
                run(mode, kill, rep, out)
    finally:
        subprocess.run(cluster("down"), capture_output=True)
        for d in out.iterdir():  # the runs go, their logs stay (table.py --events reads them)
            if d.is_dir():
                shutil.rmtree(d, ignore_errors=True)
        print(f"the runs' logs: {out}")


if __name__ == "__main__":
    main()
