"""Follow the run's config (`cfg`) or its DistEnv (`env`) from the entry point down the call graph (stdlib `ast`).

Usage: python scripts/cfg_walk.py [PACKAGE_DIR] [--name cfg|env] [--list] [--start train.main]. The walk starts at
the entry point every rank runs (`ddp_lab.train.main`, whose parameter is the config; `env` from the first function
that binds it, Trainer.__init__ or the builder) and goes depth-first, in source
order, into each call that passes the object on: an argument that is a tracked name, an attribute chain or subscript
of one (`cfg.sync`, `self.cfg`, `t.amp` after `t = cfg.trainer`), or an object carrying it (the Trainer `self`;
`self.x = Klass(cfg)` when Klass.__init__ keeps a part). Callees resolve statically (module functions, `from ddp_lab.x
import f` / `mod.f`, classes' __init__, methods on `self` and on instances of known classes); other calls are skipped.
In the callee, the parameter that got the object is tracked. Each function counts once. "Returns up": steps of the
visit order to a function in a higher layer (lower number in LAYERS). "Returns to a module left": modules of the
visit order (repeats in a row collapsed) seen before, with another module in between. "Calls into a higher layer":
calls that pass the object from a function to one in a higher layer (the walk's edges, not its order), each listed.
A second walk follows the whole object only (not `cfg.sync`, `cfg["x"]`): the functions a part reaches unnarrowed.

"Climbs back up" (the figure the house is held to: at most 2): calls that pass the object from a function to one
in a module already on the current call path, other than the caller's own module: a part handing the config back
to a module above it on the way down (builder -> workload -> builder would be one; builder -> fast_path, then later
builder -> fast_path again is not: the builder is the caller both times). Each such call is listed.
"""
from __future__ import annotations

import argparse
import ast
from pathlib import Path

# Layers, highest first, by module path under the package; "x" covers x and x.*. Old flat and new folder names.
LAYERS = {
    0: ["train"],
    1: ["trainer", "training", "builder", "callbacks", "workload", "data", "tasks", "evaluation", "optim", "fast_path",
        "memory_estimate"],
    2: ["checkpoint", "sync", "guards", "telemetry"],
    3: ["models", "datasets", "collectives", "tuning"],
    4: ["distributed", "rendezvous"],
    5: ["config", "schema", "presets", "keys", "targets"],
}


def layer(module: str) -> int | None:
    """The layer of a module named relative to the package; None outside the map (e.g. tools.*)."""
    return next((n for n, names in LAYERS.items() if any(module == x or module.startswith(x + ".") for x in names)),
                None)


def dotted(node) -> str | None:
    """`a.b.c` for a chain of names and attributes, else None."""
    if isinstance(node, ast.Attribute) and (base := dotted(node.value)):
        return f"{base}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else None


def in_order(fn, kinds) -> list:
    """The nodes of these kinds in a function, in source order; a statement sorts by its end, after its parts."""
    at = {n: (n.end_lineno, n.end_col_offset) if isinstance(n, ast.stmt) else (n.lineno, n.col_offset)
          for n in ast.walk(fn) if isinstance(n, kinds)}
    return sorted(at, key=at.get)


class Index:
    """Every module under the package: its top-level functions and classes, and its imports."""

    def __init__(self, root: Path):
        self.pkg, self.mods = root.name, {}
        for path in sorted(root.rglob("*.py")):
            parts = [root.name, *path.relative_to(root).with_suffix("").parts]
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            package = name if path.stem == "__init__" else name.rpartition(".")[0]
            tree, imports = ast.parse(path.read_text(), str(path)), {}
            for node in (n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)):  # (`import x` is not followed)
                base = package.rsplit(".", node.level - 1)[0] if node.level else ""  # `from .x import y`: relative
                source = ".".join(filter(None, (base, node.module)))
                imports.update({a.asname or a.name: (source, a.name) for a in node.names})  # name -> (module, symbol)
            defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
            self.mods[name] = (defs, imports)

    def lookup(self, module: str, name: str, depth: int = 0):
        """`name` in `module`: (module, def node, None), ("module", full name) or None; follows re-exports."""
        defs, imports = self.mods.get(module, ({}, {}))
        if name in defs:
            return module, defs[name], None
        if name in imports and depth < 10:
            return self.lookup(*imports[name], depth + 1)
        return ("module", f"{module}.{name}") if f"{module}.{name}" in self.mods else None

    def resolve(self, module: str, chain: str):
        """A dotted name (`f`, `mod.f`, `Klass.method`) used in `module`, as lookup() answers."""
        found = self.lookup(module, chain.split(".")[0])
        for part in chain.split(".")[1:]:
            found = self.lookup(found[1], part) if found and found[0] == "module" else (
                found and isinstance(found[1], ast.ClassDef) and self.method(found, part))
        return found or None

    def method(self, cls, name: str):
        """(module, def, class) of method `name` on class (module, ClassDef) or on its bases."""
        if hit := next((f for f in cls[1].body if isinstance(f, ast.FunctionDef) and f.name == name), None):
            return cls[0], hit, cls
        bases = [self.resolve(cls[0], b) for b in filter(None, map(dotted, cls[1].bases))]
        return next((h for b in bases if b and isinstance(b[1], ast.ClassDef) and (h := self.method(b, name))), None)


class Walk:
    """One depth-first walk. In a function `names` hold (a part of) the object, `typed` maps names to known classes
    (module, ClassDef, None); a typed name with tracked names under it (`self` with `self.cfg`) carries the object."""

    def __init__(self, index: Index, parts: bool = True):
        self.index, self.order, self.made = index, {}, {}  # order: key -> (module, depth); made: an __init__'s state
        self.parts = parts
        self.path: list[str] = []  # the modules of the functions on the current call path, outermost first
        self.climbs: list[str] = []  # calls back into a module already on the path (see the module docstring)

    def key(self, module: str, fn, cls=None) -> str:
        return f"{module.removeprefix(self.index.pkg + '.')}.{cls[1].name + '.' if cls else ''}{fn.name}"

    def holds(self, node, names: set, typed: dict):
        """What an expression holds: True (the object or a part of it), the dotted name of a carrier, or None."""
        if isinstance(node, (ast.IfExp, ast.BoolOp)):  # `a if c else b`, `a or b`: either side
            sides = [node.body, node.orelse] if isinstance(node, ast.IfExp) else node.values
            return next((h for h in (self.holds(n, names, typed) for n in sides) if h), None)
        if isinstance(node, (ast.Subscript, ast.Starred)):  # cfg["_target_"]: a part
            return True if self.parts and self.holds(node.value, names, typed) else None
        if (d := dotted(node)) and any(d == n or self.parts and d.startswith(n + ".") for n in names):
            return True
        return d if d in typed and any(n.startswith(d + ".") for n in names) else None

    def rebase(self, old: str, new: str, names: set, typed: dict, into_names: set, into_typed: dict) -> None:
        """Copy what `old` carries to `new`: a carrier passed as an argument, or kept as `self.x`."""
        into_names.update([new + n[len(old):] for n in names if n.startswith(old + ".")])
        into_typed.update({new + k[len(old):]: c for k, c in list(typed.items()) if (k + ".").startswith(old + ".")})

    def callee(self, module: str, func, typed: dict):
        """The target of a call to `func`: (module, def, class, receiver expression, first parameter bound), or None."""
        if isinstance(func, ast.Attribute) and dotted(func.value) in typed:  # self.method(), self.x.method()
            return (hit := self.index.method(typed[dotted(func.value)], func.attr)) and (*hit, func.value, True)
        found = dotted(func) and self.index.resolve(module, dotted(func))
        if found and isinstance(found[1], ast.ClassDef):  # Klass(...): its __init__
            return (hit := self.index.method(found, "__init__")) and (*hit, None, True)
        if not found or found[0] == "module":
            return None
        classmethod_ = any(dotted(d) == "classmethod" for d in found[1].decorator_list)  # cls: bound, not an argument
        return (*found, None, classmethod_)  # a function, Klass.method (static, or a classmethod)

    def bind(self, call, target, names: set, typed: dict):
        """The callee's tracked and typed names, from the call's receiver and arguments."""
        fn, receiver, bound = target[1], target[3], target[4]
        params, new_names, new_typed = [a.arg for a in fn.args.posonlyargs + fn.args.args], set(), {}
        pairs = [(params[0], receiver)] if bound and params and receiver else []
        params = params[1:] if bound else params
        rest, named = fn.args.vararg and fn.args.vararg.arg, set(params) | {a.arg for a in fn.args.kwonlyargs}
        pairs += [(params[i] if i < len(params) else rest, a) for i, a in enumerate(call.args)]
        pairs += [(k.arg if k.arg in named else fn.args.kwarg and fn.args.kwarg.arg, k.value) for k in call.keywords]
        for param, arg in pairs:
            if isinstance(held := param and self.holds(arg, names, typed), str):
                self.rebase(held, param, names, typed, new_names, new_typed)
            elif held:
                new_names.add(param)
        return new_names, new_typed

    def assign(self, node, module: str, names: set, typed: dict) -> None:
        """Track what an assignment binds: `t = cfg.trainer`, `tr = self`, `self.x = Klass(cfg)` (Klass' state)."""
        for lhs_all in getattr(node, "targets", [getattr(node, "target", None)]):
            both = isinstance(lhs_all, ast.Tuple) and isinstance(node.value, ast.Tuple)  # a, b = x, y
            pairs = zip(lhs_all.elts, node.value.elts) if both else [(lhs_all, node.value)]
            for d, value in ((dotted(lhs), value) for lhs, value in pairs if dotted(lhs)):
                if isinstance(held := self.holds(value, names, typed), str):
                    self.rebase(held, d, names, typed, names, typed)
                elif held:
                    names.add(d)
                elif isinstance(value, ast.Call) and (klass := self.index.resolve(module, dotted(value.func) or "")) \
                        and isinstance(klass[1], ast.ClassDef) and (init := self.index.method(klass, "__init__")):
                    made = self.made.get(self.key(*init))  # the state its __init__ ended with, when the walk went in
                    if made and any(self.bind(value, (*init, None, True), names, typed)):
                        self.rebase(made[0], d, made[1], made[2], names, typed)
                    typed[d] = klass  # a known class: its methods resolve

    def visit(self, target, names: set, typed: dict, depth: int = 0) -> None:
        """Record a function, then follow its calls and assignments in source order (an assignment after its value)."""
        module, fn, cls = target[:3]
        caller = self.path[-1] if self.path else None
        if caller is not None and module != caller and module in self.path:
            self.climbs.append(f"{list(self.order)[-1]} -> {self.key(module, fn, cls)}")
        self.path.append(module)
        self.order[key := self.key(module, fn, cls)] = (module.removeprefix(self.index.pkg + "."), depth)
        if cls and fn.args.args:
            typed.setdefault(fn.args.args[0].arg, cls)  # self: its methods resolve
        for node in in_order(fn, (ast.Call, ast.Assign, ast.AnnAssign)):
            if isinstance(node, ast.stmt) and node.value:
                self.assign(node, module, names, typed)
            elif isinstance(node, ast.Call) and (callee := self.callee(module, node.func, typed)) \
                    and self.key(*callee[:3]) not in self.order and any(new := self.bind(node, callee, names, typed)):
                self.visit(callee, *new, depth + 1)
        if cls and fn.name == "__init__":
            self.made[key] = (fn.args.args[0].arg, names, typed)
        self.path.pop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("package", nargs="?", type=Path, default=Path(__file__).resolve().parent.parent / "ddp_lab")
    parser.add_argument("--name", choices=["cfg", "env"], action="append", help="default: both")
    parser.add_argument("--list", action="store_true", help="the visited functions in order, with their layers")
    parser.add_argument("--start", default="train.main", help="module.function to start at (default: the entry point)")
    args = parser.parse_args()
    index = Index(args.package.resolve())
    module, _, function = f"{index.pkg}.{args.start}".rpartition(".")
    start = (module, index.mods[module][0][function], None)
    trainer = next((m, d["Trainer"]) for m, (d, _) in index.mods.items() if isinstance(d.get("Trainer"), ast.ClassDef))
    for name in args.name or ["cfg", "env"]:
        # the entry point binds `cfg`; `env` is first bound where the Trainer (or its builder) receives it
        begin = start if name == "cfg" else index.method(trainer, "__init__")
        whole = Walk(index, parts=False)  # only the calls that pass the whole object, not one of its groups
        whole.visit(begin, {name}, {})
        walk = Walk(index)
        walk.visit(begin, {name}, {})
        modules = [m for m, _ in walk.order.values()]
        layers = [layer(m) for m in modules]
        up = sum(1 for a, b in zip(layers, layers[1:]) if a is not None and b is not None and b < a)
        runs = [m for i, m in enumerate(modules) if i == 0 or m != modules[i - 1]]
        back = sum(1 for i, m in enumerate(runs) if m in runs[:i])
        depths, callers = [d for _, d in walk.order.values()], []
        for i, d in enumerate(depths):  # a function's caller: the last one before it, one level shallower
            callers.append(next((j for j in range(i - 1, -1, -1) if depths[j] == d - 1), None))
        calls_up = [i for i, j in enumerate(callers) if j is not None and None not in (layers[i], layers[j])
                    and layers[i] < layers[j]]
        print(f"{name}: {len(walk.order)} functions in {len(set(modules))} modules; {len(walk.climbs)} climbs back up; "
              f"{up} returns up a layer; "
              f"{back} returns to a module left; {len(calls_up)} calls into a higher layer; "
              f"the whole {name} reaches {len(whole.order) - 1} functions: {', '.join(list(whole.order)[1:])}")
        keys = list(walk.order)
        for i in calls_up:
            print(f"  up: {keys[callers[i]]} -> {keys[i]}")
        for climb in walk.climbs:
            print(f"  climb: {climb}")
        for (key, (_, depth)), number in zip(walk.order.items(), layers) if args.list else ():
            print(f"  {'?' if number is None else number}  {'  ' * depth}{key}")


if __name__ == "__main__":
    main()
