#!/usr/bin/env bash
# Every injected fault of ddp_lab.bench.faults once more, 2 ranks, dist.timeout_s=20 (about 4 min).
set -euo pipefail
cd "$(dirname "$0")/../../.."
python -m ddp_lab.bench.faults --timeout-s 20 --out docs/results/2026-11-27_xeon-2c_faults-rerun
