#!/bin/bash
# What the shell sees when a torchrun launch of ddp_lab fails or is stopped:
# each case's console (torchrun's and the ranks' stderr) and torchrun's exit status.
#   bash run.sh [OUT]   (from the repository root, with .venv; about 3 minutes on 2 cores)
# Each launch runs in a session of its own (setsid), as a terminal's foreground job;
# a signal goes to torchrun (or to one rank) once rank 0 has logged that training starts,
# plus 3 s. SIGINT is reset to its default first, as an interactive shell does for a
# foreground job (a script's background job starts with SIGINT ignored).
set -u
OUT=$(realpath "${1:-docs/results/2026-11-27_xeon-2c_exit-codes}")
RUNS=$(mktemp -d)  # run directories (checkpoints) stay out of docs/
TORCHRUN=$(realpath .venv/bin/torchrun)
LONG="data=synthetic data.num_train=60000 data.num_test=256 trainer.epochs=1 trainer.compile=false"

launch() {  # NAME SIGNAL TORCHRUN_ARGS -- OVERRIDES...
    local name=$1 sig=$2 targs=$3; shift 4
    mkdir -p "$OUT/$name"
    setsid python3 -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])' \
        "$TORCHRUN" --standalone --nproc_per_node=2 $targs -m ddp_lab.train \
        "hydra.run.dir=$RUNS/$name" "$@" > "$OUT/$name/console.txt" 2>&1 &
    local pid=$! rank1=""
    if [ "$sig" != none ]; then
        for _ in $(seq 600); do grep -q "trainer.compile=false" "$RUNS/$name/rank0.log" 2>/dev/null && break; sleep 0.2; done
        sleep 3
        for p in $(pgrep -P $pid); do tr '\0' '\n' < /proc/$p/environ | grep -qx RANK=1 && rank1=$p; done
        case $sig in
            TERM|INT) kill -$sig $pid ;;
            TERM-rank1|KILL-rank1) kill -${sig%-rank1} $rank1 ;;
        esac
    fi
    wait $pid
    echo "$?" > "$OUT/$name/exit_status"
}

launch refusal none "" -- data.num_workers=-1
DDP_LAB_FAULT=rank=1,step=5,kind=raise launch failure none "" -- $LONG
launch sigterm-torchrun TERM "" -- $LONG
launch sigint-torchrun INT "" -- $LONG
launch sigint-torchrun-signals-to-handle INT "--signals-to-handle=SIGTERM,SIGHUP,SIGQUIT" -- $LONG
launch sigterm-rank1 TERM-rank1 "" -- $LONG
launch sigkill-rank1 KILL-rank1 "" -- $LONG
rm -rf "$RUNS"
python3 "$(dirname "$0")/count.py" "$OUT" | tee "$OUT/summary.txt"
