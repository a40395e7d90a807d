"""Every path and module a docstring, a comment, a config or a guide names exists.

What is read (the whole text of each file, code and docstrings alike):
  every .py under ddp_lab/, every .yaml under conf/, README.md, CONTRIBUTING.md, the guides
  docs/*.md and docs/results/README.md (not the dated records docs/results/20*/: they are
  history, and name what existed when they were made), the Makefile and scripts/.

What counts as a mention, and what it must be:
  * a repository path: `ddp_lab/`, `conf/`, `docs/`, `scripts/`, `tests/` or `examples/` and what
    follows up to a space, quote, bracket, comma, colon or semicolon, not right after a letter,
    digit, `.`, `/` or `-` (so `/usr/share/docs/x` and `multirun/conf/x` are not mentions), a
    trailing `.` and a `#anchor` cut off. It must be a file or a folder of the repository.
  * in ddp_lab's own files also a path relative to the package that starts with one of its
    sub-packages and ends in a file's extension or `/` (`sync/every_step/ddp.py`,
    `checkpoint/reshard.py`, `training/`; not `collectives/step`): it must be under ddp_lab/.
  * a dotted name `ddp_lab.a.b...`: its longest prefix that is a module on disk (ddp_lab/a/b.py
    or ddp_lab/a/b/__init__.py; ddp_lab.conf is conf/, as pyproject.toml maps it) must be followed
    by nothing, or by a name that module defines at its top level (def, class, assignment or
    import, read from its AST, never imported); what follows that name is not checked.
  Not mentions: URLs (`scheme://...`), `${...}` interpolations, a file at a past commit
  (`git show dac1b7d:docs/lab_notebook.md`: a hex revision, a colon, the path), OmegaConf resolvers'
  names (those a `register_new_resolver("...")` registers), run-directory files
  (`outputs/<run id>/...`, which start with none of the prefixes above), system paths, the few in
  NOT_OURS below, and placeholders: a mention holding `<`, `{`, `*` or `...`, or with a part that
  is one letter (`ddp_lab.tools.bench.X`, `from ddp_lab.x import f`, `scripts/X.sh`).
"""
from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ddp_lab"
MOVED_PACKAGES = {"ddp_lab.conf": ROOT / "conf"}  # pyproject.toml's package-dir
SUBPACKAGES = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())

PATH = re.compile(r"(?<![\w./-])(?:ddp_lab|conf|docs|scripts|tests|examples)/[^\s`'\"()\[\]|,;:]*")
SHORT = re.compile(rf"(?<![\w./-])(?:{'|'.join(SUBPACKAGES)})/[^\s`'\"()\[\]|,;:]*")
DOTTED = re.compile(r"(?<![\w./-])ddp_lab(?:\.\w+)+")
NOT_MENTIONS = re.compile(r"\w+://\S*|\$\{[^}]*\}|\b[0-9a-f]{7,40}[\^~\d]*:\S*")
RESOLVER = re.compile(r"register_new_resolver\(\s*[\"']([\w.]+)[\"']")

# Mentions that are right as they are though nothing of ours is there: (file, mention).
NOT_OURS = {
    # the tools' old short names, which docs/results/README.md maps to today's for the older records
    *(("docs/results/README.md", m) for m in ("ddp_lab.costmodel", "ddp_lab.cluster", "ddp_lab.bench.faults")),
    # a user's own project, laid out by the guide
    ("docs/your_model.md", "conf/model/net.yaml"), ("docs/your_model.md", "conf/data/mine.yaml"),
    # keys in torchrun's store, not files
    ("ddp_lab/distributed/rendezvous.py", "ddp_lab/attempt"), ("ddp_lab/distributed/torchrun.py", "ddp_lab/closed"),
    # the link the GPU check makes to conf/ on a machine where ddp_lab is not installed
    ("scripts/gpu_check.sh", "ddp_lab/conf"),
}


def scanned() -> list[Path]:
    files = [*sorted(PACKAGE.rglob("*.py")), *sorted((ROOT / "conf").rglob("*.yaml")),
             ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md")),
             ROOT / "docs" / "results" / "README.md", ROOT / "Makefile",
             *sorted(p for p in (ROOT / "scripts").rglob("*") if p.is_file())]
    return [f for f in files if f.exists() and "__pycache__" not in f.parts]


def placeholder(mention: str) -> bool:
    return (any(c in mention for c in "<{*") or "..." in mention
            or any(re.fullmatch(r"[A-Za-z]", part) for part in re.split(r"[/.]", mention)))


@cache
def top_level_names(module: Path) -> frozenset[str]:
    names = set()
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return frozenset(names)


def module_file(dotted: str) -> Path | None:
    """The file of module `dotted` on disk, or None."""
    for moved, folder in MOVED_PACKAGES.items():
        if dotted == moved or dotted.startswith(moved + "."):
            base = folder.joinpath(*dotted[len(moved) + 1:].split(".")) if dotted != moved else folder
            break
    else:
        base = ROOT.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def dotted_exists(mention: str) -> bool:
    parts = mention.split(".")
    for n in range(len(parts), 0, -1):
        found = module_file(".".join(parts[:n]))
        if found is not None:
            return n == len(parts) or parts[n] in top_level_names(found)
    return False


def trimmed(mention: str) -> str:
    """Without its `#anchor` and a sentence's closing `.`."""
    return mention.split("#")[0].rstrip(".")


@cache
def there(path: Path) -> bool:
    """A file, or a folder holding a file (one left with only __pycache__ by a move is not there)."""
    return path.is_file() or path.is_dir() and any(f.is_file() and "__pycache__" not in f.parts
                                                    for f in path.rglob("*"))


def path_exists(mention: str, base: Path) -> bool:
    return there(base / mention.rstrip("/"))


def resolvers(files: list[Path]) -> set[str]:
    return {name for f in files if f.suffix == ".py" for name in RESOLVER.findall(f.read_text())}


def missing_mentions() -> list[tuple[str, int, str]]:
    files = scanned()
    skip = resolvers(files)
    out = []
    for f in files:
        rel = f.relative_to(ROOT).as_posix()
        in_package = rel.startswith("ddp_lab/")
        for number, line in enumerate(f.read_text().splitlines(), 1):
            line = NOT_MENTIONS.sub(" ", line)
            checks = [(trimmed(m), lambda m: path_exists(m, ROOT)) for m in PATH.findall(line)]
            if in_package:
                checks += [(m, lambda m: path_exists(m, PACKAGE)) for m in map(trimmed, SHORT.findall(line))
                           if re.search(r"(\.\w+|/)$", m)]
            checks += [(m, dotted_exists) for m in DOTTED.findall(line) if m not in skip]
            for mention, exists in checks:
                if placeholder(mention) or (rel, mention) in NOT_OURS or exists(mention):
                    continue
                out.append((rel, number, mention))
    return out


def test_every_named_path_and_module_exists():
    missing = [f"{rel}:{n}: {m}" for rel, n, m in missing_mentions()]
    assert not missing, "named but not there (fix the mention, or the matching rule in this docstring):\n" + \
        "\n".join(missing)


def test_the_rules_themselves():
    assert dotted_exists("ddp_lab.sync.sharded.zero1") and dotted_exists("ddp_lab.config.ConfigError")
    assert dotted_exists("ddp_lab.conf") and not dotted_exists("ddp_lab.bench.scaling")
    assert not dotted_exists("ddp_lab.distributed.no_such_helper")
    assert path_exists("sync/every_step/ddp.py", PACKAGE) and not path_exists("sync/ddp.py", PACKAGE)
    assert placeholder("ddp_lab.tools.bench.X") and placeholder("ddp_lab/sync/{ddp,flat}.py")
    assert not placeholder("ddp_lab/sync/every_step/ddp.py")
    text = ("see https://x.org/docs/a.md, outputs/${ddp_lab.run_id:}/x, /usr/share/docs/y, "
            "git show dac1b7d^:docs/old.md (docs/memory.md).")
    line = NOT_MENTIONS.sub(" ", text)
    assert PATH.findall(line) == ["docs/memory.md"] and DOTTED.findall(line) == []
    found = SHORT.findall("the map (sync/__init__.py), training/, collectives/step, conf/sync/x.yaml, sync/ddp.py.")
    assert found == ["sync/__init__.py", "training/", "collectives/step", "sync/ddp.py."]
    assert trimmed("docs/concepts.md#the-run-directory") == "docs/concepts.md"
    assert trimmed("sync/ddp.py.") == "sync/ddp.py"
