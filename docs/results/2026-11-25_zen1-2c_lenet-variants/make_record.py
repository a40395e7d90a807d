# Ran with the code of commit 35db1a2cf; it imports ddp_lab internals that have moved or gone since,
# so it runs at that commit only: git worktree add /tmp/ddp_lab-35db1a2cf 35db1a2cf
"""Write record.json for this folder (run once, after the rounds): this machine's facts
from ddp_lab.provenance, with the code identified as the measured checkout's commit."""
import json
import sys
from pathlib import Path

from ddp_lab.provenance import write_record

HERE = Path(__file__).resolve().parent
MEASURED = "35db1a2cf3750318aa93121c0c463a0e192e05cf"

peaks = json.loads((HERE / "mfu" / "peak_flops.json").read_text())
write_record(HERE, "docs/results/2026-11-25_zen1-2c_lenet-variants/run_round.sh ROUND (ROUND=1..5)", {
    "what": "model=lenet against model=lenet_fast, 2 ranks x 1 thread, 2 epochs, Fashion-MNIST, "
            "eager and compiled, interleaved rounds; fp32 (trainer.amp=auto: no bf16 here)",
    "git_commit": MEASURED, "git_dirty": False, "git_dirty_files": [],
    "git_note": "measured from a clean export of the commit (`git archive 35db1a2 | tar -x` into "
                "/tmp/ddp_lab_measure, with a symlink ddp_lab/conf -> ../conf standing in for the "
                "package-dir mapping), so the code is exactly the commit's",
    "avx512_bf16": False, "amx": False,
    "peak_flops": {k: v["flops_per_sec"] for k, v in peaks.items()},
    "notes": sys.argv[1:],
})
print((HERE / "record.json").read_text())
