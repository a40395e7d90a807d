"""The race: python -m ddp_lab.tools.bench.peers --out DIR [--rounds 3] -- OVERRIDES (see __init__)."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

from ddp_lab.telemetry.provenance import command_line, write_record

# and the packages each needs (one of them)
PEERS = {"plain_ddp": (), "with_fabric": ("lightning_fabric", "lightning"), "with_accelerate": ("accelerate",)}


def installed(system: str) -> bool:
    return not PEERS[system] or any(importlib.util.find_spec(m) is not None for m in PEERS[system])


def command(system: str, nproc: int, run_dir: Path, a) -> list[str]:
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    variants = getattr(a, "variants", {})
    system = getattr(a, "peer_variants", {}).get(system, (system, {}))[0]
    if system == "ddp_lab" or system in variants:
        return [*launch, "-m", "ddp_lab.train", *a.overrides, f"hydra.run.dir={run_dir}",
                f"trainer.max_steps={a.steps}", f"trainer.warmup_steps={a.warmup}", "trainer.epochs=1000",
                "trainer.progress=false", *shlex.split(a.ddp_lab_args), *shlex.split(variants.get(system, ""))]
    return [*launch, "-m", f"ddp_lab.tools.bench.peers.{system}", f"--steps={a.steps}",
            f"--warmup={a.warmup}", f"--out={run_dir / 'summary.json'}", *a.overrides]


def stolen_seconds() -> float:
    """CPU time the hypervisor gave to other guests so far (/proc/stat's steal; 0 where unknown): a run
    that lost much of it to a noisy neighbour is not a measure of the trainer."""
    try:
        with open("/proc/stat") as f:
            return int(f.readline().split()[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def run(system: str, rnd: int, a) -> dict:
    run_dir = a.out / "runs" / f"{system}-{rnd}"
    cmd = command(system, a.nproc, run_dir, a)
    print(f"[round {rnd + 1}] {system}: {shlex.join(cmd)}", flush=True)
    stolen = stolen_seconds()
    env = {**os.environ, **getattr(a, "peer_variants", {}).get(system, ("", {}))[1]}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, env=env)
    stolen = stolen_seconds() - stolen
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "output.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        sys.exit(f"{system} failed in round {rnd + 1} (exit {proc.returncode}); its log: {run_dir / 'output.log'}")
    summary = json.loads((run_dir / "summary.json").read_text())
    print(f"    {summary['step_ms']:.1f} ms/step ({stolen:.1f} s of CPU stolen by the hypervisor)", flush=True)
    return {"system": system, "round": rnd, "step_ms": summary["step_ms"], "stolen_s": round(stolen, 2),
            "command": shlex.join(cmd)}


def table(rows: list[dict], systems: list[str]) -> str:
    """Median and range of each system's step, and each against the fastest peer's median."""
    ms = {s: sorted(r["step_ms"] for r in rows if r["system"] == s) for s in systems}
    med = {s: statistics.median(v) for s, v in ms.items()}
    fastest = min((s for s in systems if s in PEERS), key=med.get, default=None)  # (not a ddp_lab variant)
    stolen = {s: max(r["stolen_s"] for r in rows if r["system"] == s) for s in systems}
    lines = ["| trainer | ms a step (median) | range | runs | against the fastest peer | CPU stolen, most in a run |",
             "|---|---:|---:|---:|---:|---:|"]
    for s in systems:
        against = f"{med[s] / med[fastest]:.3f}x" if fastest else ""
        lines.append(f"| {s} | {med[s]:.1f} | {ms[s][0]:.1f}-{ms[s][-1]:.1f} | {len(ms[s])} | {against} "
                     f"| {stolen[s]:.1f} s |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m ddp_lab.tools.bench.peers", description=__doc__)
    p.add_argument("--out", type=Path, required=True, help="the record's folder (runs/, results.json, table.md)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, each running every system once")
    p.add_argument("--nproc", type=int, default=2, help="ranks of each run")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=10, help="steps left out of the step time")
    p.add_argument("--systems", default="ddp_lab," + ",".join(PEERS),
                   help="comma-separated: ddp_lab and the peers (those not installed are left out, said once)")
    p.add_argument("--ddp-lab-args", default="", help="overrides for ddp_lab alone (e.g. sync=ddp)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=OVERRIDES",
                   help="ddp_lab again under more overrides, raced as its own system: the control that isolates "
                        "a cause (e.g. --variant ddp_lab_ddp='sync=ddp'); repeatable")
    p.add_argument("--peer-variant", action="append", default=[], metavar="NAME=PEER VAR=VALUE...",
                   help="a peer again under environment variables, raced as its own system: does a machine "
                        "setting help the peer as much (e.g. --peer-variant plain_keep='plain_ddp "
                        "MALLOC_TRIM_THRESHOLD_=2147483647'); repeatable")
    p.add_argument("--timeout", type=float, default=900, help="seconds one run may take")
    p.add_argument("overrides", nargs="*", help="the model, data, optim and trainer.amp, for every system")
    argv = sys.argv[1:] if argv is None else argv
    a = p.parse_args(argv)
    a.variants = {}
    for v in a.variant:
        name, _, overrides = v.partition("=")
        if not name.strip() or not overrides.strip() or name.strip() in ("ddp_lab", *PEERS):
            sys.exit(f"--variant {v!r}: give NAME=OVERRIDES with a new name, e.g. --variant ddp_lab_ddp='sync=ddp'")
        a.variants[name.strip()] = overrides
    a.peer_variants = {}
    for v in a.peer_variant:
        name, _, spec = v.partition("=")
        peer, *assignments = spec.split() or [""]
        env = dict(x.partition("=")[::2] for x in assignments)
        if (not name.strip() or name.strip() in ("ddp_lab", *PEERS, *a.variants) or peer not in PEERS or not env
                or not all(k and val for k, val in env.items())):
            sys.exit(f"--peer-variant {v!r}: give NAME='PEER VAR=VALUE ...' with a new name and a peer among "
                     f"{', '.join(PEERS)}, e.g. --peer-variant plain_keep='plain_ddp MALLOC_TOP_PAD_=0'")
        a.peer_variants[name.strip()] = (peer, env)
    systems = [s.strip() for s in a.systems.split(",") if s.strip()] + list(a.variants) + list(a.peer_variants)
    unknown = [s for s in systems if s != "ddp_lab" and s not in PEERS and s not in a.variants
               and s not in a.peer_variants]
    if unknown:
        sys.exit(f"--systems: {', '.join(unknown)} unknown; choose among ddp_lab, {', '.join(PEERS)}")
    peer_of = {s: a.peer_variants.get(s, (s,))[0] for s in systems}
    missing = [s for s in systems if peer_of[s] in PEERS and not installed(peer_of[s])]
    if missing:
        print(f"left out, not installed: {', '.join(f'{s} ({PEERS[peer_of[s]][0]})' for s in missing)}",
              flush=True)
        systems = [s for s in systems if s not in missing]
    if (a.out / "results.json").exists():
        sys.exit(f"{a.out} already holds a race (results.json): give another --out")
    rows = []
    for rnd in range(a.rounds):
        turn = rnd % len(systems)  # rotated each round: no system always runs first or last
        rows += [run(s, rnd, a) for s in systems[turn:] + systems[:turn]]
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "results.json").write_text(json.dumps(rows, indent=1))
    text = table(rows, systems)
    (a.out / "table.md").write_text(text)
    write_record(a.out, command_line("ddp_lab.tools.bench.peers", argv),
                 {"overrides": a.overrides, "nproc": a.nproc, "steps": a.steps, "warmup": a.warmup,
                  "peer_variants": {k: {"peer": p, "env": e} for k, (p, e) in a.peer_variants.items()}})
    print(text, end="")


if __name__ == "__main__":
    main()
