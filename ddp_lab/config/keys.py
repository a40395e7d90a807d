"""A config key: its default, one line of help, and the range check() accepts.

Every config dataclass (ddp_lab.config.schema, ddp_lab.config.presets) declares its keys
with `key(...)`; a key with a fixed list of values is a `Choice`.
"""
from __future__ import annotations

import math
from dataclasses import field
from enum import Enum
from typing import Any, Callable


class Choice(str, Enum):
    """A config value from a fixed list, equal to (and printed as) its name."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


def choices(name: str, values: str) -> type[Choice]:
    return Choice(name, [(v, v) for v in values.split()])


TRI_STATE = ("auto", "true", "false")  # a plain string: YAML would read true/false as booleans


def key(default: Any, help: str, *, at_least: float | None = None,
        ok: Callable[[Any], bool] | None = None, rule: str = "") -> Any:
    """A config key: its default, one line of help, and what check() accepts.

    at_least: the smallest value; ok/rule: any other test, and what it requires
    ("a positive, finite number"), said in the error line.
    """
    if at_least is not None:
        ok, rule = (lambda v, n=at_least: v >= n), rule or f">= {at_least:g}"
    meta = {"help": help, "ok": ok, "rule": rule}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def one_of(values: tuple[str, ...]) -> Callable[[Any], bool]:
    return lambda v: str(v).lower() in values


def non_empty(v) -> bool:
    return len(v) > 0


def positive_finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


def fraction(v) -> bool:
    return isinstance(v, (int, float)) and 0 < v < 1
