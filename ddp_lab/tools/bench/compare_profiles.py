"""Two step timelines side by side: where one trainer's step spends what the other's does not.

    python -m ddp_lab.tools.bench.compare_profiles RUN_A/profile/rank0.json RUN_B/profile/rank0.json

Each file is a torch.profiler Chrome trace of a few whole steps: ddp_lab's `trainer.profile=true`, or a
peer's `--profile-steps N` (tools/bench/peers). Per step, for each: the host's time in top-level ops (an op
not inside another on its thread), the ops dispatched, the GPU's kernels and busy time, the CUDA runtime
calls; then the ops whose count or host time per step differ most. On a small model the host is the step,
so what one trainer launches more shows here.
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
from dataclasses import dataclass


@dataclass
class Steps:
    path: str
    steps: list[float]  # ms, each profiled step
    ops: collections.Counter  # every CPU op
    top: collections.Counter  # top-level ops
    top_us: collections.Counter  # their host time
    runtime: collections.Counter  # CUDA runtime calls
    host_ms: float
    kernels: int
    gpu_busy_ms: float

    def per_step(self, counter: collections.Counter, key: str) -> float:
        return counter[key] / len(self.steps)


def read(path: str) -> Steps:
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    # (the host's marks: a CUDA trace marks each step on the GPU's timeline too, as gpu_user_annotation)
    steps = sorted((e for e in events if e.get("name", "").startswith("ProfilerStep#")
                    and e.get("cat") != "gpu_user_annotation"), key=lambda e: e["ts"])
    if not steps:
        raise SystemExit(f"{path}: no ProfilerStep in it: a trace of trainer.profile=true or --profile-steps")
    lo, hi = steps[0]["ts"], steps[-1]["ts"] + steps[-1]["dur"]
    inside = [e for e in events if lo <= e["ts"] < hi]
    cpu = sorted((e for e in inside if e.get("cat") == "cpu_op"), key=lambda e: (e["tid"], e["ts"], -e["dur"]))
    top, ends = [], {}
    for e in cpu:  # sorted by thread and start, the longest first: an op starting before the last one ended is in it
        if e["ts"] >= ends.get(e["tid"], -1):
            top.append(e)
            ends[e["tid"]] = e["ts"] + e["dur"]
    top_us = collections.Counter()
    for e in top:
        top_us[e["name"]] += e["dur"]
    kernels = [e for e in inside if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    return Steps(path, [s["dur"] / 1000 for s in steps], collections.Counter(e["name"] for e in cpu),
                 collections.Counter(e["name"] for e in top), top_us,
                 collections.Counter(e["name"] for e in inside if e.get("cat") == "cuda_runtime"),
                 sum(e["dur"] for e in top) / 1000 / len(steps), len(kernels),
                 sum(e["dur"] for e in kernels) / 1000 / len(steps))


def describe(s: Steps) -> str:
    n = len(s.steps)
    return (f"{s.path}: {n} steps of {', '.join(f'{ms:.2f}' for ms in s.steps)} ms\n"
            f"  a step: {s.host_ms:.2f} ms of host time in {sum(s.top.values()) / n:.0f} top-level ops "
            f"({sum(s.ops.values()) / n:.0f} ops in all), {s.kernels / n:.0f} kernels busy {s.gpu_busy_ms:.2f} ms, "
            f"{sum(s.runtime.values()) / n:.0f} CUDA runtime calls")


def differences(a: Steps, b: Steps, field: str, rows: int, scale: float = 1.0) -> list[str]:
    ca, cb = getattr(a, field), getattr(b, field)
    gap = {k: (a.per_step(ca, k) - b.per_step(cb, k)) * scale for k in set(ca) | set(cb)}
    return [f"  {a.per_step(ca, k) * scale:10.2f} {b.per_step(cb, k) * scale:10.2f}  {k}"
            for k in sorted(gap, key=lambda k: -abs(gap[k]))[:rows] if abs(gap[k]) >= 0.01]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m ddp_lab.tools.bench.compare_profiles", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("first", help="a Chrome trace (.json or .json.gz)")
    p.add_argument("second", help="the other")
    p.add_argument("--rows", type=int, default=25, help="rows of each difference table")
    a = p.parse_args(argv)
    first, second = read(a.first), read(a.second)
    print(describe(first), describe(second), sep="\n")
    for title, field, scale in (("ops a step (all)", "ops", 1.0), ("top-level ops a step", "top", 1.0),
                                ("host ms a step in top-level ops", "top_us", 1e-3),
                                ("CUDA runtime calls a step", "runtime", 1.0)):
        print(f"{title}: first, second", *differences(first, second, field, a.rows, scale), sep="\n")


if __name__ == "__main__":
    main()
