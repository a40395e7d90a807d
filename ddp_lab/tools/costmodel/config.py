"""The cost model's config: every key's type, default, help and range.

conf/costmodel.yaml composes on top of CostModelConfig and adds only the
presets (nominal interconnects, each figure with its source); cli.validate
keeps what needs more than one key or the files (preset names, gradients,
the inputs). `python -m ddp_lab.tools.costmodel.config` prints the reference.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from ddp_lab.config.keys import key, non_empty
from ddp_lab.config.schema import reference


@dataclass
class PresetConfig:
    alpha: float = key(MISSING, "seconds per message (>= 0, checked for the presets in params)")
    beta: float = key(MISSING, "seconds per byte on a link (>= 0, as alpha)")
    gamma: float = key(MISSING, "seconds per byte reduced (>= 0, as alpha)")
    note: str = key("", "what the figures stand for")


@dataclass
class ComputeConfig:
    batch_size: int = key(64, "per-rank batch when measuring compute (the same at every world size)", at_least=1)
    iters: int = key(3, "timed training steps (after one warm-up); the median is used", at_least=1)
    threads: int = key(1, "torch threads for the measurements (torchrun gives each worker 1)", at_least=1)


@dataclass
class CostModelConfig:
    inputs: List[str] = key([], "collectives.csv files, run directories holding one, or globs; any world "
                                "sizes mixed")
    validate: List[str] = key([], "held-out collectives.csv files: each point predicted by the fit to inputs "
                                  "(validation.csv)")
    link_rate: Optional[str] = key(None, "the links' rate, e.g. 1gbit (an emulated cluster's --rate): 1/beta "
                                         "is shown beside it")
    link_mtu: int = key(1500, "the links' MTU (--mtu): sets the TCP payload rate shown with link_rate")
    params: List[str] = key(["fitted"], "parameter sets to predict with: fitted (needs inputs) and/or names "
                                        "under presets", ok=non_empty, rule="at least one parameter set")
    gamma: str = key("measure", "seconds per byte reduced: measure (float32 add_ here) | a number | fit "
                                "(refused: not separable from beta)")
    fit_min_bytes: Optional[int] = key(None, "fit on messages of at least this many bytes (null: every size); "
                                             "a token-bucket link passes a burst at memory speed",
                                       at_least=1, rule="null (fit every size) or a size in bytes, "
                                                        "e.g. fit_min_bytes=1048576")
    measured_cores: Optional[int] = key(None, "cores the measured ranks shared: fit max(1, p/cores) x formula; "
                                              "null: textbook only", at_least=1,
                                        rule="null (textbook model) or the number of CPU cores the "
                                             "benchmark's ranks shared, e.g. measured_cores=2")
    algos: List[str] = key(["builtin", "naive", "ring", "halving_doubling", "tree"],
                           "algorithms to predict; unmeasured ones use the shared fit", ok=non_empty,
                           rule="at least one algorithm")
    world_sizes: List[int] = key([8, 64, 512, 4096], "ranks to predict for",
                                 ok=lambda v: non_empty(v) and min(v) >= 1,
                                 rule="a non-empty list of integers >= 1, e.g. 'world_sizes=[8,64,512,4096]'")
    gradients: List[Any] = key(["lenet", "resnet18"], "model names (conf/model), a model callable's dotted "
                                                      "path (my_pkg.model.net), or byte counts", ok=non_empty,
                               rule="at least one model name or byte count")
    compute_ms: Dict[str, Optional[float]] = key(
        {"lenet": None, "resnet18": None}, "compute ms per training step, by gradient; null: measure it "
                                           "(models only); for a byte count add one: +compute_ms.bytes_1000000=50")
    compute: ComputeConfig = field(default_factory=ComputeConfig)
    plot: bool = key(True, "write fit.png and predictions.png")
    presets: Dict[str, PresetConfig] = key({}, "nominal parameter sets, by name (conf/costmodel.yaml holds them "
                                               "with their sources)")


ConfigStore.instance().store(name="costmodel_schema", node=CostModelConfig)


def markdown() -> str:
    """The reference as docs/configuration.md holds it (under the tools' heading)."""
    return reference(CostModelConfig, level=4)


if __name__ == "__main__":
    print(markdown(), end="")
