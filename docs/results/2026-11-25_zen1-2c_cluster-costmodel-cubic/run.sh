#!/bin/bash
# The cost model fitted on the 2-3 host sweeps of
# ../2026-11-25_zen1-2c_cluster-collectives-cubic (TCP congestion control
# pinned to cubic) and checked on its held-out 4 and 8 hosts, at 1gbit and
# 100mbit: fitted on every size (<RATE>/), and on messages of 1 MiB and more
# (<RATE>-fit-from-1mib/, fit_min_bytes). From the repository root:
#
#   bash docs/results/2026-11-25_zen1-2c_cluster-costmodel-cubic/run.sh
#
# Each folder: output.txt, fit.csv, fit_points.csv, validation.csv,
# predictions.csv, fit.png, predictions.png, record.json. SWEEPS=<folder> fits
# on another record's sweeps, RECORD=<folder> writes there.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-.venv/bin/python}
SWEEPS=${SWEEPS:-docs/results/2026-11-25_zen1-2c_cluster-collectives-cubic}
for RATE in 1gbit 100mbit; do
    for FIT in all 1048576; do
        OUT=${RECORD:-$HERE}/$RATE
        EXTRA=()
        if [ $FIT != all ]; then OUT=${RECORD:-$HERE}/$RATE-fit-from-1mib; EXTRA=(fit_min_bytes=$FIT); fi
        $PY -m ddp_lab.costmodel "inputs=[$SWEEPS/$RATE/2h,$SWEEPS/$RATE/3h]" \
            "validate=[$SWEEPS/$RATE/4h,$SWEEPS/$RATE/8h]" link_rate=$RATE "${EXTRA[@]}" \
            'algos=[builtin,naive,ring,halving_doubling]' hydra.run.dir="$OUT" 2>&1 | tee "$OUT.txt"
        mv "$OUT.txt" "$OUT/output.txt"
    done
done
