"""Hydra's composition errors (a preset that is not there, a value of the wrong type, an override that does not
parse) in one line: Hydra prints them over several lines, the missing preset's alternatives one a line."""
from __future__ import annotations

import re

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

COMPOSITION_ERRORS = (HydraException, OmegaConfBaseException)


def composition_error(e: Exception) -> str:
    """The missing preset with the group's presets, else the first line with the first line of its cause."""
    options = [o for o in getattr(e, "options", None) or [] if not o.startswith("schema_")]
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()] or [type(e).__name__]
    first = lines[0].removeprefix("In 'train': ")
    missing = re.match(r"Could not find '([^/']+)/([^']+)'", first)
    if missing and options:
        group, name = missing.groups()
        return f"{group}={name}: no such preset; choose among {', '.join(options)} (or {group}=custom)"
    cause = str(e.__cause__).strip().splitlines()[0] if e.__cause__ else ""
    detail = cause or (lines[1] if len(lines) > 1 else "")
    return f"{first.rstrip('.')}: {detail}" if detail else first
