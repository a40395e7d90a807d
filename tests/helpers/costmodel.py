"""Shared by the cost model's tests: a link's constants, and benchmark CSVs and configs built from them."""
import csv

from hydra import compose, initialize_config_module

from ddp_lab.tools import costmodel as cm

ALPHA, BETA, GAMMA = 50e-6, 1e-9, 2e-10


SIZES = [2 ** k for k in range(12, 27)]  # 4 KiB .. 64 MiB, as the benchmark's default sweep


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cm.CSV_COLUMNS)
        w.writeheader()
        w.writerows(rows)
    return path


def bench_rows(algo, model, world, wrong=0):
    rows = []
    for n in SIZES:
        t_us = model(world, n, ALPHA, BETA, GAMMA) * 1e6 or 1.0  # a world of one: ~1 us overhead
        alg = n / t_us / 1e3
        rows.append({"algo": algo, "size_bytes": n, "count": n // 4, "dtype": "float32",
                     "world_size": world, "time_us": t_us, "algbw_gbps": alg,
                     "busbw_gbps": alg * 2 * (world - 1) / world, "wrong": wrong})
    return rows


def compose_costmodel(overrides):
    with initialize_config_module(version_base="1.3", config_module="ddp_lab.conf"):
        return compose(config_name="costmodel", overrides=overrides)
