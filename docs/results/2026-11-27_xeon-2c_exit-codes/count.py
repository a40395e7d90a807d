"""One line per case of run.sh: torchrun's exit status and how many console lines it and the ranks printed."""
import re
import sys
from pathlib import Path

for case in sorted(p for p in Path(sys.argv[1]).iterdir() if (p / "console.txt").exists()):
    lines = (case / "console.txt").read_text().splitlines()
    logged = [i for i, ln in enumerate(lines) if re.match(r"^[WEI]\d{4} ", ln)]  # torchrun's log lines
    start = next((i for i in range(len(lines) - 1) if lines[i].startswith("Traceback")
                  and "bin/torchrun" in lines[i + 1]), len(lines))  # torchrun's traceback and report
    torchrun = len(logged) + len(lines) - start
    print(f"{case.name:36} exit {(case / 'exit_status').read_text().strip():>3}   lines: {len(lines):3} "
          f"in all, {torchrun:3} torchrun's ({len(logged)} logged, {len(lines) - start} traceback and report)")
