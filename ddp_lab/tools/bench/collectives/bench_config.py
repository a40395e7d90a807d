"""The collectives benchmark's config: every key's type, default, help and range.

conf/bench_collectives.yaml composes on top of BenchCollectivesConfig, so Hydra
refuses unknown keys, wrong types and values off a list; ddp_lab.config.schema.check
refuses a value out of range, and sweep_plan.validate what depends on
two keys at once (min_bytes <= max_bytes, sizes that fit the dtype, algos that
have the chosen collective).
`python -m ddp_lab.tools.bench.collectives.bench_config` prints the reference
(docs/configuration.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List

from hydra.core.config_store import ConfigStore

from ddp_lab.config.keys import choices, key, non_empty, positive_finite
from ddp_lab.config.schema import DistConfig, reference
from ddp_lab.sync.options import Algo

Mode = choices("Mode", "sweep interleaved")
Dtype = choices("Dtype", "float32 float64 bfloat16 float16")
Collective = choices("Collective", "all_reduce reduce_scatter all_gather")


@dataclass
class InterleavedConfig:
    sizes: List[Any] = key(["64K", "1M", "4M", "16M"], "message sizes in bytes (K, M, G suffixes: powers of 1024)")
    rounds: int = key(9, "rounds; each times every algo once, in a freshly shuffled order (the same on "
                         "every rank)", at_least=1)
    warmup: int = key(2, "untimed calls before each timed block", at_least=0)
    block_bytes: int = key(8_000_000, "bytes per timed block: calls = block_bytes / size, clamped to 2..20",
                           at_least=1)


@dataclass
class BenchCollectivesConfig:
    mode: Mode = key(Mode.sweep, "sweep: every algo over every size (CSV, PNG, tb/) | interleaved: against "
                                 "builtin in shuffled rounds (interleaved.csv)")
    collective: Collective = key(Collective.all_reduce, "what is timed, as nccl-tests' all_reduce_perf | "
                                 "reduce_scatter_perf | all_gather_perf: busbw = algbw x 2(n-1)/n | (n-1)/n | "
                                 "(n-1)/n; a size is the whole buffer (all ranks' chunks), for the last two "
                                 "rounded down to a multiple of n x the element size")
    min_bytes: int = key(4096, "smallest message in bytes (nccl-tests -b); a multiple of the dtype's size",
                         at_least=1)
    max_bytes: int = key(64 << 20, "largest message in bytes (nccl-tests -e); the sweep stops at the last "
                                   "size <= this", at_least=1)
    factor: int = key(2, "each size is the previous one times this (nccl-tests -f)", at_least=2)
    dtype: Dtype = key(Dtype.float32, "element type (nccl-tests -d)")
    algos: List[Algo] = key([Algo.builtin, Algo.naive, Algo.ring, Algo.halving_doubling],
                            "swept in this order (ddp_lab.collectives' names); reduce_scatter and "
                            "all_gather have builtin, ring_textbook and direct, and this default means "
                            "those three there", ok=non_empty,
                            rule="at least one algorithm, e.g. 'algos=[builtin,ring]'")
    warmup: int = key(5, "untimed calls per size after the correctness call, cut to fit half of "
                         "time_budget_s (nccl-tests -w)", at_least=0)
    iters: int = key(50, "timed calls per size at most (nccl-tests -n)", at_least=1)
    min_iters: int = key(3, "timed calls per size at least, even when one call exceeds time_budget_s",
                         at_least=1)
    time_budget_s: float = key(0.5, "target seconds of timed calls per size and algo", ok=positive_finite,
                               rule="a positive number of seconds")
    check: bool = key(True, "verify each size against the exact sum (wrong: mismatched elements; -1 when off)")
    plot: bool = key(True, "write collectives.png (busbw and time against size)")
    tensorboard: bool = key(True, "write tb/: busbw, algbw and time_us per algo at step log2(size_bytes)")
    interleaved: InterleavedConfig = field(default_factory=InterleavedConfig)
    dist: DistConfig = field(default_factory=DistConfig)


ConfigStore.instance().store(name="bench_collectives_schema", node=BenchCollectivesConfig)


def markdown() -> str:
    """The reference as docs/configuration.md holds it (under the tools' heading)."""
    return reference(BenchCollectivesConfig, level=4)


if __name__ == "__main__":
    print(markdown(), end="")
