"""Keys that changed name, meaning or units: an old spelling on the command line gets one line naming the new one.

Hydra would refuse an old key too, but in several lines that name the schema, not the fix. This runs on the
overrides before Hydra composes anything (ddp_lab/train.py), so a command line from an older guide fails at
once, on every rank alike.
"""
from __future__ import annotations

from ddp_lab.config import ConfigError

# old key -> what to write instead (a key, or a group choice such as `sync=<name>`)
RENAMED = {
    "sync.mode": "sync=<strategy> (e.g. sync=diloco; under islands, the strategy across them)",
    "trainer.eval_every": "trainer.eval_every_epochs (it counts epochs; trainer.eval_every_steps counts steps)",
    "trainer.ckpt_every": "trainer.ckpt_every_steps",
}


def key_of(override: str) -> str:
    """`sync.every` of `sync.every=8`, `+sync.every=8`, `++sync.every=8` or `~sync.every`."""
    return override.lstrip("+~").split("=", 1)[0].strip()


def refuse_renamed(overrides: list[str]) -> None:
    """Raise ConfigError at the first override that uses an old key."""
    for o in overrides:
        k = key_of(o)
        if k in RENAMED:
            value = f"={o.split('=', 1)[1]}" if "=" in o else ""
            raise ConfigError(f"{k}{value} is no longer a key: use {RENAMED[k]}")
