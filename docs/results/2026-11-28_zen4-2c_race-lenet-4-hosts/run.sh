#!/bin/bash
# LeNet raced to 0.88 test accuracy where the network dominates DDP's step: 4 emulated hosts at the rate of
# rate.txt (probe.sh), by the 2-host race's script with N=4.
# Usage (from the repository root, as root): [VENV=path/to/venv] bash docs/results/2026-11-28_zen4-2c_race-lenet-4-hosts/run.sh
R=docs/results/2026-11-28_zen4-2c_race-lenet-4-hosts
R=$R N=4 RATE=${RATE:-$(cat $R/rate.txt)} exec bash docs/results/2026-11-28_xeon-2c_race-lenet-network-bound/run.sh
