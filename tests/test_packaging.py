"""pyproject.toml lists its packages by name: a subpackage or config group left
off it would be missing from an installed (non-editable) ddp_lab. Its console
commands ([project.scripts]) each name a function that exists."""
from __future__ import annotations

import importlib
from pathlib import Path

import tomllib

ROOT = Path(__file__).parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]


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


def test_every_console_command_names_a_callable():
    scripts = PYPROJECT["project"]["scripts"]
    assert "ddp-lab-cluster" in scripts and "ddp-lab-costmodel" in scripts
    for command, target in scripts.items():
        module, _, attr = target.partition(":")
        # the tools, and torchrun whose agents leave in order (the one command of the core)
        ours = module.startswith("ddp_lab.tools.") or module == "ddp_lab.distributed.torchrun"
        assert ours and attr, f"{command} = {target!r}: expected ddp_lab.tools.X:func"
        assert callable(getattr(importlib.import_module(module), attr, None)), f"{command}: {target} is no callable"
