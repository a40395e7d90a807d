"""The allreduce benchmark, in the style of nccl-tests: `torchrun -m ddp_lab.tools.bench.collectives`.

    sweep.py         the program: times each (algorithm, size) point of a sweep (mode=sweep)
    interleaved.py   mode=interleaved: the algorithms against builtin in shuffled rounds
    sweep_plan.py    the config checked against the world; sizes; algbw and busbw
    check.py         the exact-sum check of each point (nccl-tests' #wrong)
    output.py        the CSV, the printed table, the median of several sweeps
    bench_config.py  the typed config: each key's default, help and range
"""
