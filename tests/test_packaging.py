"""pyproject.toml lists its packages by name: a new subpackage left off it would
be missing from an installed (non-editable) ddp_lab."""
from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_every_subpackage_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "ddp_lab").rglob("__init__.py")}
    assert found, "no packages found under ddp_lab/"
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
