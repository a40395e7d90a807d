#!/bin/bash
# The sweeps of sweep.sh (2, 3, 4 and 8 hosts,
# one rank each, 64 KiB-16 MiB, builtin, ring, halving_doubling and naive, then
# bench.link_share), again with the hosts' TCP congestion control pinned to
# cubic (c74a13a). As root, from the repository root:
#
#   bash docs/results/2026-11-25_zen1-2c_cluster-collectives-cubic/run.sh 1gbit
#   bash docs/results/2026-11-25_zen1-2c_cluster-collectives-cubic/run.sh 100mbit
#
# Writes <this folder>/<RATE>/ as sweep.sh does.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
RECORD=$HERE exec bash "$HERE/sweep.sh" "$@"
