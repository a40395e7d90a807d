"""The periodic strategies' keys: what every one takes (sync.every, sync.islands and the strategy inside them),
local SGD's synchronous start, DiLoCo's outer optimizer, wire, overlap and fragments; each with its rules."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List

from ddp_lab.collectives.quantized import BITS as QUANTIZED
from ddp_lab.config import ConfigError
from ddp_lab.config.keys import choices, key, positive_finite
from ddp_lab.sync.islands.layout import ISLANDS_HELP, islands_spec_ok
from ddp_lab.sync.options import SyncOptions

DEFAULT_INNER = "ddp"  # the every-step strategy inside islands unless sync/inner=<name> says otherwise


@dataclass
class PeriodicOptions(SyncOptions):
    """The keys of the strategies that send weights (or their change) every sync.every steps."""

    # Hydra: the inner strategy's node, merged after this one's own keys (sync/inner=<name> chooses another)
    defaults: List[Any] = field(default_factory=lambda: ["_self_", {"inner": DEFAULT_INNER}], repr=False)
    every: int = key(8, "steps between synchronisations of the weights (H)", at_least=1)
    islands: str = key("none", ISLANDS_HELP + "; this strategy runs across them, sync.inner every step inside",
                       ok=islands_spec_ok, rule="none, host or a positive integer")
    inner: Any = key(None, "sync.islands: the every-step strategy inside each island, chosen with "
                           "sync/inner=<name> (ddp, flat, zero, fsdp), its keys under sync.inner.<key>")

    fault_tolerance: str = key("none", "none | torchft: each island its own torchrun job and a torchft replica "
                                       "group, found through a Lighthouse: a lost island leaves the next round "
                                       "(diloco, local_sgd) or step (ft_ddp), the others go on, and it rejoins "
                                       "from a peer (docs/failures.md)",
                               ok=lambda v: v in ("none", "torchft"), rule="none or torchft")
    lighthouse: str = key("", "sync.fault_tolerance=torchft: the Lighthouse's address, http://HOST:PORT (empty: "
                              "$TORCHFT_LIGHTHOUSE)")
    island: int = key(-1, "sync.fault_tolerance=torchft: this job's island, 0 .. sync.max_islands-1 (-1: "
                          "$DDP_LAB_ISLAND)", at_least=-1)
    max_islands: int = key(0, "sync.fault_tolerance=torchft: the islands the run is planned for; the training data "
                              "is cut into as many parts, island i reading part i (an absent island's part is "
                              "skipped while it is away)", at_least=0)
    min_islands: int = key(1, "sync.fault_tolerance=torchft: the fewest islands a round runs with (torchft's "
                              "min_replica_size); with fewer it waits for more, up to 10 x sync.island_timeout_s, "
                              "then the island stops", at_least=1)
    island_timeout_s: float = key(30.0, "sync.fault_tolerance=torchft: how long an exchange across islands or a "
                                        "rejoin's transfer waits before the round is given up",
                                  ok=positive_finite, rule="a positive number")

    def inside(self) -> SyncOptions:
        """The inner strategy's options (sync/inner; ddp's at their defaults where none was composed)."""
        from ddp_lab.sync.registry import inner_options
        return self.inner if self.inner is not None else inner_options(DEFAULT_INNER)

    def check(self, name: str) -> None:
        from ddp_lab.sync.registry import name_of
        inner = name_of(self.inside())
        if str(getattr(self.inside(), "islands", "none")) != "none":  # (fsdp's HSDP, inside an island)
            raise ConfigError(f"sync.inner.islands={self.inside().islands}: islands are made by sync.islands, not "
                              f"by the strategy inside them: leave sync.inner.islands out")
        if self.fault_tolerance == "torchft":
            self._check_fault_tolerant()
        if str(self.islands) == "none":
            if inner != DEFAULT_INNER:
                raise ConfigError(f"sync/inner={inner} is the strategy inside islands, and sync.islands=none makes "
                                  f"none: set sync.islands=host (or K), or leave sync/inner out")
            return
        for where, algo in (("sync.algo", self.algo), ("sync.inner.algo", self.inside().algo)):
            if algo != "builtin":
                raise ConfigError(f"sync.islands={self.islands} runs torch's collectives on each island's process "
                                  f"group: use {where}=builtin, not {where}={algo}")

    def _check_fault_tolerant(self) -> None:
        """sync.fault_tolerance=torchft: islands are torchrun jobs, a periodic strategy or DDP crosses them."""
        if str(self.islands) != "host":
            raise ConfigError(f"sync.fault_tolerance=torchft makes each torchrun job an island: set sync.islands=host, "
                              f"not sync.islands={self.islands}")
        if self.max_islands < 1:
            raise ConfigError("sync.fault_tolerance=torchft cuts the training data for the islands planned: set "
                              "sync.max_islands to their number (e.g. sync.max_islands=3)")
        if self.min_islands > self.max_islands:
            raise ConfigError(f"sync.min_islands={self.min_islands} is more than sync.max_islands="
                              f"{self.max_islands}: no round could commit")
        if self.island >= self.max_islands:
            raise ConfigError(f"sync.island={self.island} is not one of the {self.max_islands} islands planned: use "
                              f"0 .. {self.max_islands - 1}")


@dataclass
class LocalSGDOptions(PeriodicOptions):
    local_sgd_start_step: int = key(0, "average gradients every step for this many first steps, then weights "
                                       "every sync.every (post-local SGD)", at_least=0)

    def check(self, name: str) -> None:
        super().check(name)
        if str(self.islands) != "none" and self.local_sgd_start_step:
            raise ConfigError(f"sync.local_sgd_start_step={self.local_sgd_start_step} averages gradients over every "
                              f"rank for its first steps, which islands leave to sync.inner: use "
                              f"sync.local_sgd_start_step=0")


OuterWire = choices("OuterWire", "none bf16 fp16 int8 int4")


@dataclass
class DiLoCoOptions(PeriodicOptions):
    compress: OuterWire = key(OuterWire.none, "what the outer gradient crosses the wire as: none | bf16 | fp16 (a "
                                              "cast) | int8 | int4 (quantized in blocks, summed in fp32)")
    outer_lr: float = key(0.7, "the outer optimizer's learning rate (DiLoCo's paper: 0.7)", ok=positive_finite,
                          rule="a positive number")
    outer_momentum: float = key(0.5, "the outer Nesterov momentum (0: none; why 0.5 rather than the paper's 0.9: "
                                     "docs/defaults.md)", ok=lambda v: 0 <= v < 1, rule="in [0, 1)")
    overlap: int = key(0, "inner steps the outer gradient's all-reduce travels behind before its outer step lands "
                          "(Streaming DiLoCo's tau; 0: every rank waits for it)", at_least=0)
    overlap_mix: float = key(0.8, "sync.overlap > 0, delayed: the share of its own weights a rank keeps when the "
                                  "outer step lands (0: replaced by the anchor; docs/defaults.md)",
                             ok=lambda v: 0 <= v <= 1, rule="in [0, 1]")
    fragments: int = key(1, "the parameters cut into this many runs of about equal size, each synchronised every "
                            "sync.every steps at its own offset, so each sync sends 1/F of the outer gradient "
                            "(Streaming DiLoCo; 1: all at once)", at_least=1)
    overlap_update: str = key("delayed", "sync.overlap > 0: how a rank goes on while its outer gradient travels: "
                                         "delayed (from its own weights, the landed anchor mixed in by "
                                         "sync.overlap_mix) | eager (at once from the anchor a proxy outer step "
                                         "gives, corrected when the mean lands)",
                              ok=lambda v: v in ("delayed", "eager"), rule="delayed or eager")
    eager_proxy: str = key("local", "sync.overlap_update=eager: what stands for the mean outer gradient until it "
                                    "lands: local (this rank's own) | paper ((own + M mean_last - own_last) / M, "
                                    "our adaptation of Kale et al.'s proxy to an overlap shorter than a round); "
                                    "docs/bandwidth.md compares them", ok=lambda v: v in ("local", "paper"),
                           rule="local or paper")
    rounding: str = key("feedback", "sync.compress=int8|int4: how numbers round to their levels: feedback (to "
                                    "nearest, each round's residual added to the next: no bias over rounds) | "
                                    "stochastic (unbiased, no state) | nearest (neither); docs/bandwidth.md",
                        ok=lambda v: v in ("nearest", "feedback", "stochastic"),
                        rule="nearest, feedback or stochastic")

    def check(self, name: str) -> None:
        super().check(name)
        if self.fault_tolerance == "torchft":
            if self.compress in QUANTIZED:  # (torchft's Manager makes only its all-reduce fault tolerant)
                raise ConfigError(f"sync.fault_tolerance=torchft averages the outer gradient with torchft's "
                                  f"all-reduce: sync.compress={self.compress} is not made fault tolerant (int8/int4 "
                                  f"travel by all-to-all and all-gather); use sync.compress=bf16, fp16 or none")
            apart = self.every // self.fragments  # (the fewest steps between two fragments' sends)
            if self.fragments > 1 and self.overlap >= apart:  # (the islands meet between exchanges, none under way)
                raise ConfigError(f"sync.fault_tolerance=torchft: one exchange travels at a time, and sync.overlap="
                                  f"{self.overlap} leaves one under way at the next fragment's send ({apart} steps "
                                  f"later at sync.every={self.every}, sync.fragments={self.fragments}): use "
                                  f"sync.overlap below {apart}, or fewer fragments")
        if self.algo != "builtin" and (self.compress in QUANTIZED or self.overlap or self.fragments > 1):
            raise ConfigError(f"sync.algo={self.algo}: DiLoCo's int8/int4, overlap and fragments run on torch's "
                              f"collectives: use sync.algo=builtin")
        if self.eager_proxy != "local" and self.overlap_update != "eager":
            raise ConfigError(f"sync.eager_proxy={self.eager_proxy} is what eager's outer step stands on, and "
                              f"sync.overlap_update={self.overlap_update}: set sync.overlap_update=eager, or leave "
                              f"sync.eager_proxy out")
        if self.overlap_update == "eager" and not self.overlap:
            raise ConfigError("sync.overlap_update=eager takes the outer step before the mean lands, and "
                              "sync.overlap=0 waits for it: set sync.overlap to 1 or more (e.g. 2), or leave "
                              "sync.overlap_update out")
        if self.fragments > 1 and self.fragments > self.every:
            raise ConfigError(f"sync.fragments={self.fragments} must be at most sync.every={self.every}: each "
                              f"fragment synchronises at its own step of the {self.every}")
        if self.overlap and self.overlap >= self.every:
            raise ConfigError(f"sync.overlap={self.overlap} must be less than sync.every={self.every}: the outer "
                              f"step lands before the next synchronisation")


@dataclass
class FTDDPOptions(PeriodicOptions):
    """sync=ft_ddp: DDP across torchft islands (sync/periodic/ft_ddp.py): islands, torchft and a step a round."""

    every: int = key(1, "steps between exchanges across islands: 1, every step (ft_ddp averages gradients)",
                     at_least=1)
    islands: str = key("host", ISLANDS_HELP + "; ft_ddp: host, each torchrun job an island",
                       ok=islands_spec_ok, rule="none, host or a positive integer")
    fault_tolerance: str = key("torchft", "ft_ddp: torchft (its islands are torchft replica groups)",
                               ok=lambda v: v in ("none", "torchft"), rule="none or torchft")

    def check(self, name: str) -> None:
        self.refuse_algo(name, ("builtin",), "is not run across torchft islands (torch's collectives inside each, "
                                             "torchft's across)")
        if self.fault_tolerance != "torchft":
            raise ConfigError("sync=ft_ddp is DDP across torchft islands: keep sync.fault_tolerance=torchft (without "
                              "torchft, DDP over every rank is sync=ddp)")
        if self.every != 1:
            raise ConfigError(f"sync=ft_ddp averages the gradients every step: leave sync.every out (not "
                              f"{self.every}); rounds of several steps are sync=diloco")
        super().check(name)
