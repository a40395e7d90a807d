"""The trainer against a d2l baseline, on the same machine, data and epochs:
`python -m ddp_lab.tools.bench.vs_baseline` (compare.py says what it measures and how).

    compare.py       the program: runs the systems in alternating rounds, writes the record
    runs.py          each system's command line, one run as a subprocess, the plan of a round
    table.py         the table: medians, ratios to the baseline, scaling efficiency, notes
    baseline_mfu.py  the baselines' MFU, counted as the trainer counts its own
"""
