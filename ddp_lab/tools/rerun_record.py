"""A record measured again on the machine of the day, into a folder of its own:

    python -m ddp_lab.tools.rerun_record docs/results/<date>_<machine>_<what> [RECORD ...] [--script run.sh]

A record's scripts write beside themselves (`here=$(dirname "$0")`), so one run where it lies, on another machine,
would overwrite the figures the guides cite with another machine's under the first machine's name. Each record
named here gets a new folder beside it, `<today>_<this machine>_<what>/` (the short name record.json gives), with
its scripts and helpers (`*.sh`, `*.py`, not its figures); the script runs from the repository root as its header
says, what it prints is kept in `rerun.log`, and `record.json` says where, on what code, and what it reruns.
Records run one after another (two benchmarks at once fake each other's figures); the first that fails stops the
rest. A folder that is already there is never written into.
"""
from __future__ import annotations

import argparse
import datetime
import shutil
import subprocess
import sys
from pathlib import Path

from ddp_lab.telemetry.provenance import machine_facts, write_record

REPO = Path(__file__).resolve().parents[2]


def new_folder(record: Path, machine: str, today: str) -> Path:
    """`<today>_<machine>_<what>` beside `record` (`<date>_<machine>_<what>`)."""
    parts = record.name.split("_", 2)
    if len(parts) != 3:
        raise SystemExit(f"rerun_record: {record.name} is not named <date>_<machine>_<what>: name a record folder "
                         f"of docs/results/")
    return record.parent / f"{today}_{machine}_{parts[2]}"


def plan(records: list[str], script: str, machine: str, today: str) -> list[tuple[Path, Path]]:
    """(record, its new folder) for each, every refusal found before anything runs."""
    out = []
    for name in records:
        record = Path(name)
        if not (record / script).is_file():
            raise SystemExit(f"rerun_record: {record / script} is not there: name a record folder that holds "
                             f"{script} (or pass --script)")
        new = new_folder(record, machine, today)
        if new.exists() or new in [n for _, n in out]:
            raise SystemExit(f"rerun_record: {new} is already there, and is never written into: move it away first")
        out.append((record, new))
    return out


def rerun(record: Path, new: Path, script: str) -> int:
    """Copy record's scripts into `new`, run its `script` there from the repository root; its exit code."""
    new.mkdir(parents=True)
    for path in sorted(record.iterdir()):
        if path.is_file() and path.suffix in (".sh", ".py"):
            shutil.copy2(path, new / path.name)
    command = ["sh", str(new / script)]
    with open(new / "rerun.log", "w") as log:
        code = subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
    write_record(new, " ".join(command), {"rerun_of": str(record), "exit_code": code})
    return code


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m ddp_lab.tools.rerun_record",
                                 description="records measured again on this machine, each into a new folder")
    ap.add_argument("records", nargs="+", help="record folders (docs/results/<date>_<machine>_<what>)")
    ap.add_argument("--script", default="run.sh", help="the record's script to run (default run.sh)")
    ap.add_argument("--dry-run", action="store_true", help="say which folders would be made, run nothing")
    args = ap.parse_args(argv)
    machine = machine_facts()["machine"]
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    for record, new in plan(args.records, args.script, machine, today):
        print(f"{record} -> {new}", flush=True)
        if args.dry_run:
            continue
        code = rerun(record, new, args.script)
        if code:
            raise SystemExit(f"rerun_record: {new / args.script} exited {code} (its output: {new / 'rerun.log'}); "
                             f"the records after it were not run")


if __name__ == "__main__":
    main(sys.argv[1:])
