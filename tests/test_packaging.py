"""pyproject.toml lists its packages by name: a subpackage or config group left
off it would be missing from an installed (non-editable) ddp_lab."""
from __future__ import annotations

from pathlib import Path

import tomllib

ROOT = Path(__file__).parents[1]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_subpackage_is_listed_in_pyproject():
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "ddp_lab").rglob("__init__.py")}
    assert "ddp_lab.collectives" in found
    assert found - set(SETUPTOOLS["packages"]) == set(), "add these to [tool.setuptools] packages"


def test_every_config_group_ships_its_yaml_files():
    groups = {f"ddp_lab.conf.{d.name}" for d in (ROOT / "conf").iterdir() if any(d.glob("*.yaml"))}
    assert "ddp_lab.conf.trainer" in groups
    for package in groups | {"ddp_lab.conf"}:
        assert package in SETUPTOOLS["packages"], f"add {package} to [tool.setuptools] packages"
    assert "*.yaml" in SETUPTOOLS["package-data"]["*"], 'keep "*" = ["*.yaml"] in [tool.setuptools.package-data]'
