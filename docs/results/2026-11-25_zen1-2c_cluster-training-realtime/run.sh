#!/bin/bash
# The training runs of ../2026-11-25_zen1-2c_cluster-training-cubic again
# after 6c39702: every emulated host's ranks now count as sharing this
# machine's cores, so gloo's threads run at real-time priority across hosts as
# they did on loopback. Step times predicted from the fits of
# ../2026-11-25_zen1-2c_cluster-realtime/costmodel. As root, from the
# repository root:
#
#   bash docs/results/2026-11-25_zen1-2c_cluster-training-realtime/run.sh
#
# Writes one folder per bench.scaling run (scaling.csv/md/png, record.json,
# runs.csv), then table.md and bandwidth_matters.png.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
RECORD=$HERE FITS=$HERE/../2026-11-25_zen1-2c_cluster-realtime/costmodel LONG_CHECK=0 \
    bash "$HERE/../2026-11-25_zen1-2c_cluster-training-cubic/run.sh"
