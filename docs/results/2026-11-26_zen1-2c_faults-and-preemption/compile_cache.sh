#!/bin/bash
# The wall time of a 2-rank launch whose first step compiles LeNet (3 steps in all),
# with each rank's own inductor cache (ddp_lab's default) or one cache shared by
# both ranks (TORCHINDUCTOR_CACHE_DIR set, as before), each cold (emptied first)
# and warm (right after a cold run); compile off gives the launch's cost without
# compiling. Three rounds. Prints: round mode cache seconds.
set -eu
PY=${PY:-.venv/bin/python}
SHARED=/tmp/ddp_lab_shared_inductor_cache
OWN="$($PY -c 'from torch._inductor.runtime.cache_dir_utils import default_cache_dir as d; print(d())')"
ARGS="data=synthetic data.num_train=4096 data.num_test=256 data.batch_size=64 trainer.epochs=1
      trainer.max_steps=3 trainer.progress=false trainer.keep_ckpts=0"
launch() {  # $1 compile true|false, $2 run dir: prints the seconds
    local t0 t1
    t0=$(date +%s.%N)
    OMP_NUM_THREADS=1 $PY -m torch.distributed.run --standalone --nproc_per_node=2 \
        -m ddp_lab.train $ARGS trainer.compile="$1" hydra.run.dir="$2" >/dev/null 2>&1
    t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc
}
echo "round mode cache seconds"
for round in 1 2 3; do
    rm -rf /tmp/cc-$round-none
    echo "$round no-compile - $(unset TORCHINDUCTOR_CACHE_DIR; launch false /tmp/cc-$round-none)"
    for mode in per-rank shared; do
        for cache in cold warm; do
            if [ "$cache" = cold ]; then rm -rf "$SHARED" "$OWN"/rank*; fi
            dir=/tmp/cc-$round-$mode-$cache
            rm -rf "$dir"
            if [ "$mode" = shared ]; then
                s=$(export TORCHINDUCTOR_CACHE_DIR=$SHARED; launch true "$dir")
            else
                s=$(unset TORCHINDUCTOR_CACHE_DIR; launch true "$dir")
            fi
            echo "$round $mode $cache $s"
        done
    done
done
