"""The keys every sync strategy takes; each strategy's own keys are a dataclass beside its class.

`sync=<name>` picks a strategy and with it the dataclass that types the `sync` group (sync/registry.py), so
`sync=diloco sync.every=8` is accepted and `sync=ddp sync.every=8` refused in one line: a key belongs to the
strategies that read it. The rules between a strategy's keys are its options' `check()`.
"""
from __future__ import annotations

from dataclasses import dataclass

from ddp_lab.collectives import ALGORITHMS
from ddp_lab.config import ConfigError
from ddp_lab.config.keys import TRI_STATE, choices, key, one_of, positive_finite

Algo = choices("Algo", " ".join(ALGORITHMS))
Cast = choices("Cast", "none bf16 fp16")  # what an every-step strategy's gradients cross the wire as


@dataclass
class SyncOptions:
    """The keys of every strategy: how a buffer is reduced, how a CPU rank waits, and the units that stage 3
    and fsdp gather one at a time (also what trainer.activation_checkpointing recomputes, in every strategy)."""

    algo: Algo = key(Algo.builtin, "how a buffer is all-reduced: builtin (gloo/NCCL) or a hand-written one "
                                   "(ddp_lab.collectives)")
    shard_units: str = key("auto", "the model's units: what zero stage 3 and fsdp gather one at a time and "
                                   "trainer.activation_checkpointing recomputes: auto (the model's repeated block "
                                   "class at any depth, else by size up to sync.unit_mb) or comma-separated class "
                                   "names (e.g. Block)")
    unit_mb: float = key(100.0, "sync.shard_units=auto on a model with no repeated block: a module of at most this "
                                "many MB is a unit, a larger one is split into its children",
                         ok=positive_finite, rule="a positive number of MB")
    poll: str = key("false", "opt-in: CPU ranks wait for the builtin all-reduce by polling (auto: where the "
                             "ranks fill the cores exactly); paid on one CPU of three (docs/defaults.md)",
                    ok=one_of(TRI_STATE), rule="one of auto, true, false")

    def check(self, name: str) -> None:
        """Refuse what the keys' ranges cannot see alone (a pair of keys), naming the keys and the fix;
        `name`: the strategy's, as sync=<name> chose it."""

    def resolved(self, device) -> SyncOptions:
        """The options of the strategy that runs on this device: these (sync=auto: flat's or ddp's)."""
        return self

    def refuse_algo(self, name: str, allowed: tuple[str, ...], why: str) -> None:
        if self.algo not in allowed:
            raise ConfigError(f"sync.algo={self.algo} {why}: sync={name} takes sync.algo={' or '.join(allowed)}")
