"""The package's layout: a core that a training run needs, and tools beside it.

The tools (benchmarks, cost model, emulated cluster, the chapter's baselines,
figures) use the core; the core never imports a tool, and no two packages
import each other, so a reader can follow a run without meeting them.
"""
import ast
import subprocess
import sys
from pathlib import Path

import ddp_lab

PACKAGE = Path(ddp_lab.__file__).parent
TOOLS = {"bench", "costmodel", "cluster", "baselines", "figures"}


def part(module: str) -> str:
    """ddp_lab.bench.scaling -> bench; any core module -> core."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in TOOLS else "core"


def imports() -> dict[str, set[str]]:
    """Every ddp_lab module and the ddp_lab modules it imports (in functions too)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(p for p in rel.parts if p != "__init__")
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        found[name] = {n for n in names if n.startswith("ddp_lab.")}
    return found


def test_the_core_imports_no_tool():
    offending = sorted(f"{m} -> {n}" for m, names in imports().items() if part(m) == "core"
                       for n in names if part(n) != "core")
    assert offending == []


def test_no_two_packages_import_each_other():
    edges = {(part(m), part(n)) for m, names in imports().items() for n in names if part(m) != part(n)}
    assert {(a, b) for a, b in edges if (b, a) in edges} == set()


def test_the_training_entry_point_loads_no_tool_module():
    code = ("import sys, ddp_lab.train; print(' '.join(m for m in sys.modules "
            "if m.startswith('ddp_lab.') and m.split('.')[1] in %r))" % (TOOLS,))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == []
