"""The config's one check at start-up, before any rank waits for another.

First every key in its range (schema.check), then every rule that ties two groups together, each
with its one-line error. A rule about one group's keys lives in the schema; a rule that needs
what was built (the data's task, the world size) is said by who builds it.
"""
from __future__ import annotations

from ddp_lab.config import ConfigError, schema


def evaluations_fall_on_synchronisations(cfg) -> None:
    """trainer x sync: an evaluation scores weights every rank holds, which local_sgd and diloco
    have only at their synchronisations."""
    every, s = cfg.trainer.eval_every_steps, cfg.sync
    if s.mode in ("local_sgd", "diloco") and every % s.every:
        raise ConfigError(f"trainer.eval_every_steps={every} must be a multiple of sync.every={s.every} "
                          f"with sync.mode={s.mode}: an evaluation scores weights every rank holds")


def stage_three_runs_eagerly(cfg) -> None:
    """trainer x sync: ZeRO stage 3 gathers and frees each block's weights in module hooks that resize
    their storage, which ddp_lab does not compile; fsdp shards the eager model's blocks."""
    if str(cfg.trainer.compile).lower() != "true":
        return
    if cfg.sync.mode == "zero" and cfg.sync.zero_stage == 3:
        raise ConfigError("trainer.compile=true cannot run with sync.zero_stage=3, whose module hooks gather "
                          "and free the weights by resizing their storage: set trainer.compile=false (or auto)")
    if cfg.sync.mode == "fsdp":
        raise ConfigError("trainer.compile=true cannot run with sync.mode=fsdp: ddp_lab applies fully_shard to "
                          "the eager model's blocks: set trainer.compile=false (or auto)")


RULES = (evaluations_fall_on_synchronisations, stage_three_runs_eagerly)


def validate(cfg) -> None:
    """Raise ConfigError, naming the keys and the fix, at the first value or pair of values that cannot run."""
    schema.check(cfg)
    for rule in RULES:
        rule(cfg)
