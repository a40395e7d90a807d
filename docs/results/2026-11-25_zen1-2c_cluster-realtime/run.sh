#!/bin/bash
# The cluster's collective records again after 6c39702 and its ring change:
# every emulated host's ranks are now counted as sharing this machine's cores,
# so gloo's threads run at real-time priority (dist.comm_threads=auto), as 2
# local ranks on 2 cores get them; across hosts the ring cuts chunks of 512 KiB
# or more in two. As root, from the repository root:
#
#   bash docs/results/2026-11-25_zen1-2c_cluster-realtime/run.sh
#
# Writes sweeps/<RATE>/ (2, 3, 4 and 8 hosts, 64 KiB-16 MiB, as
# ../2026-11-25_zen1-2c_cluster-collectives-cubic/sweep.sh), interleaved/<RATE>/ (8 hosts
# in shuffled rounds at 4 and 16 MiB, as ../2026-11-25_zen1-2c_cluster-8-hosts-interleaved/run.sh)
# and costmodel/ (fitted on sweeps/ at 2-3 hosts, checked at 4 and 8, as
# ../2026-11-25_zen1-2c_cluster-costmodel-cubic/run.sh), for 1gbit and 100mbit.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
for RATE in 1gbit 100mbit; do
    RECORD=$HERE/sweeps bash "$HERE/../2026-11-25_zen1-2c_cluster-collectives-cubic/sweep.sh" $RATE
    mkdir -p "$HERE/interleaved"
    RECORD=$HERE/interleaved bash "$HERE/../2026-11-25_zen1-2c_cluster-8-hosts-interleaved/run.sh" $RATE
done
mkdir -p "$HERE/costmodel"
SWEEPS=${HERE#"$PWD"/}/sweeps RECORD=$HERE/costmodel bash "$HERE/../2026-11-25_zen1-2c_cluster-costmodel-cubic/run.sh"
