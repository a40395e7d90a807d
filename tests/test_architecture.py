"""The package's layout: a core that a training run needs, and the tools beside it.

The tools (ddp_lab/tools/: benchmarks, cost model, emulated cluster, the chapter's baselines,
figures) use the core; the core never imports a tool. No loop among the packages, of any
length: a reader can follow a run from layer to layer without meeting a module twice.
"""
import ast
import subprocess
import sys
from pathlib import Path

import ddp_lab

PACKAGE = Path(ddp_lab.__file__).parent


def part(module: str) -> str:
    """The package a module belongs to: ddp_lab.sync.every_step.ddp -> sync, ddp_lab.tools.bench.scaling ->
    tools.bench; a module at the top (ddp_lab.train) is a part of its own."""
    parts = module.split(".")[1:] or ["__init__"]
    return ".".join(parts[:2]) if parts[0] == "tools" and len(parts) > 1 else parts[0]


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


def package_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for m, names in imports().items():
        for n in names:
            if part(m) != part(n):
                edges.setdefault(part(m), set()).add(part(n))
    return edges


def loops(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one package (Tarjan's algorithm)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(set(edges) | {w for ws in edges.values() for w in ws}):
        if v not in index:
            visit(v)
    return found


def test_loops_are_found():
    assert loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert loops({"a": {"b"}, "b": {"c"}}) == []


def test_no_loop_among_the_packages():
    assert loops(package_edges()) == []


def test_the_core_imports_no_tool():
    offending = sorted(f"{m} -> {n}" for m, names in imports().items() if not part(m).startswith("tools")
                       for n in names if part(n).startswith("tools"))
    assert offending == []


def test_the_training_entry_point_loads_no_tool_module_and_installs_no_import_hook():
    """ddp_lab.train imports no ddp_lab.tools module. The tools run by their own module names
    (ddp_lab.tools.bench.scaling): no finder of ddp_lab's on sys.meta_path or sys.path_hooks, and no old
    short name (ddp_lab.bench) to import. (One fresh interpreter for both: importing torch takes seconds.)"""
    code = ("import importlib.util, sys; import ddp_lab; "
            "hooks = [type(f).__module__ for f in sys.meta_path]; "
            "hooks += [getattr(h, '__module__', '') for h in sys.path_hooks]; "
            "print(' '.join(m for m in hooks if m.startswith('ddp_lab'))); "
            "print(importlib.util.find_spec('ddp_lab.bench')); import ddp_lab.train; "
            "print(' '.join(m for m in sys.modules if m.startswith('ddp_lab.tools')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["", "None", ""]


def test_python_m_runs_a_tool_by_its_module_name():
    out = subprocess.run([sys.executable, "-m", "ddp_lab.tools.costmodel", "--help"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "costmodel" in out.stdout


ALLOWED_SHARED_NAMES: dict[str, set[str]] = {}  # none: every module says by its file name what it is


def test_no_two_modules_share_a_file_name():
    """A file name says which module it is: no `faults.py` in guards/ and in tools/bench/ for a reader
    (or a traceback, or a search for the file) to mix up. __init__.py and __main__.py aside."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py"):
            found.setdefault(path.name, set()).add(path.relative_to(PACKAGE).as_posix())
    shared = {name: sorted(paths) for name, paths in found.items()
              if len(paths) > 1 and not paths <= ALLOWED_SHARED_NAMES.get(name, set())}
    assert shared == {}, "rename the tools' (or the newer) module to say what it is"


def test_the_config_is_followed_from_the_entry_point_through_the_builder_only():
    """scripts/cfg_walk.py's walk of `cfg` from ddp_lab.train.main: the Trainer receives built parts (its __init__
    never sees the config), the builder hands each group to its part, and no part climbs back up (at most 2)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("cfg_walk", PACKAGE.parent / "scripts" / "cfg_walk.py")
    cfg_walk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cfg_walk)
    index = cfg_walk.Index(PACKAGE)
    walk = cfg_walk.Walk(index)
    walk.visit(("ddp_lab.train", index.mods["ddp_lab.train"][0]["main"], None), {"cfg"}, {})
    assert "training.builder.build" in walk.order and "training.trainer.Trainer.__init__" not in walk.order
    assert len(walk.climbs) <= 2, walk.climbs
    # below the builder: each part's own package, or a layer below it (config's _target_, models' checks)
    order = list(walk.order.items())
    start = next(i for i, (k, _) in enumerate(order) if k == "training.builder.build")
    depth, part = order[start][1][1], None
    for key, (module, d) in order[start + 1:]:
        if d <= depth:
            break
        if d == depth + 1:
            part = module
        else:
            own = module.split(".")[0] == part.split(".")[0]
            assert own or cfg_walk.layer(module) > cfg_walk.layer(part), f"{part} hands cfg to {key}"
