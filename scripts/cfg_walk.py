"""Follow the run's config (`cfg`) or its DistEnv (`env`) from Trainer.__init__ down the call graph.

Static analysis, stdlib `ast` only. The walk starts in `Trainer.__init__` with the tracked name and follows,
depth-first and in source order, each call that passes the object on: an argument that is a tracked name, an
attribute chain or subscript of one (`cfg.sync`, `self.cfg`, `t.amp` after `t = cfg.trainer`), or an object that
carries it (the Trainer `self`; `self.x` built as `Klass(cfg, ...)` when Klass.__init__ keeps a part on `self`).
Callees resolve statically: module functions, `from ddp_lab.x import f` / `mod.f`, classes (their __init__),
methods on `self` (and its bases), on `super()` and on carriers. Calls on objects of unknown type are skipped.
In a callee the parameter that received the object is tracked. Each function is visited once. It counts:

  functions         the distinct functions the object stops in, and their modules;
  returns up        steps of the visit order from a function to one in a higher layer (lower number, LAYERS);
  returns to a      reappearances of a module in the visit order's modules (consecutive repeats collapsed)
  module left       after another module came between.

Usage: python scripts/cfg_walk.py [PACKAGE_DIR] [--name cfg|env] [--list]
"""
from __future__ import annotations

import argparse
import ast
from collections import namedtuple
from pathlib import Path

# Layers, highest first, by module path under the package; "x" covers x and x.*. Old flat and new folder names.
LAYERS = {
    0: ["train"],
    1: ["trainer", "training", "workload", "data", "tasks", "evaluation", "optim", "fast_path", "memory_estimate"],
    2: ["checkpoint", "sync", "guards", "telemetry"],
    3: ["models", "datasets", "collectives", "tuning"],
    4: ["distributed", "rendezvous"],
    5: ["config", "schema", "presets", "keys", "targets"],
}

# An object holding (parts of) the tracked one: its class, the attributes that hold a part, the carriers kept on it.
Carrier = namedtuple("Carrier", "cls attrs subs")


def layer(module: str) -> int | None:
    """The layer of a module named relative to the package; None outside the map (e.g. tools.*)."""
    return next((n for n, names in LAYERS.items() if any(module == x or module.startswith(x + ".") for x in names)),
                None)


def dotted(node) -> str | None:
    """`a.b.c` for a chain of names and attributes, else None."""
    if isinstance(node, ast.Name):
        return node.id
    base = dotted(node.value) if isinstance(node, ast.Attribute) else None
    return base and f"{base}.{node.attr}"


def in_order(fn, kinds) -> list:
    """The nodes of these kinds in a function, in source order."""
    return sorted((n for n in ast.walk(fn) if isinstance(n, kinds)), key=lambda n: (n.lineno, n.col_offset))


class Index:
    """Every module under the package: its top-level functions and classes, and its imports."""

    def __init__(self, root: Path):
        self.pkg, self.mods = root.name, {}
        for path in sorted(root.rglob("*.py")):
            parts = [root.name, *path.relative_to(root).with_suffix("").parts]
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            package = name if path.stem == "__init__" else name.rpartition(".")[0]
            tree, imports = ast.parse(path.read_text(), str(path)), {}
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom):  # local name -> (module, symbol)
                    base = package.rsplit(".", node.level - 1)[0] if node.level else ""
                    source = ".".join(p for p in (base, node.module) if p)
                    imports.update({a.asname or a.name: (source, a.name) for a in node.names})
                elif isinstance(node, ast.Import):  # local name -> (module, None)
                    imports.update({a.asname or a.name.split(".")[0]: (a.name if a.asname else a.name.split(".")[0],
                                                                        None) for a in node.names})
            defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
            self.mods[name] = (defs, imports)

    def lookup(self, module: str, name: str, depth: int = 0):
        """`name` in `module`: (module, def node), ("module", full name) or None; follows re-exports."""
        defs, imports = self.mods.get(module, ({}, {}))
        if name in defs:
            return module, defs[name]
        if name in imports and depth < 10:
            source, symbol = imports[name]
            return ("module", source) if symbol is None else self.lookup(source, symbol, depth + 1)
        return ("module", f"{module}.{name}") if f"{module}.{name}" in self.mods else None

    def resolve(self, module: str, chain: str):
        """A dotted name (`f`, `mod.f`, `Klass.method`) used in `module`, as lookup() answers."""
        first, *rest = chain.split(".")
        found = self.lookup(module, first)
        for part in rest:
            if found and found[0] == "module":
                found = self.lookup(found[1], part)
            else:
                found = found and isinstance(found[1], ast.ClassDef) and self.method(found, part)
        return found or None

    def method(self, cls, name: str, own: bool = True):
        """(module, def, class) of method `name` on class (module, ClassDef) or on its bases (only, if not own)."""
        hit = next((item for item in cls[1].body if isinstance(item, ast.FunctionDef) and item.name == name), None)
        if own and hit:
            return cls[0], hit, cls
        bases = [self.resolve(cls[0], b) for b in filter(None, map(dotted, cls[1].bases))]
        return next((h for b in bases if b and isinstance(b[1], ast.ClassDef) and (h := self.method(b, name))), None)


class Walk:
    """One depth-first walk; `order` lists the functions visited as (key, module, depth)."""

    def __init__(self, index: Index):
        self.index, self.order, self.seen, self.building = index, [], set(), set()

    def key(self, module: str, fn, cls=None) -> str:
        return f"{module.removeprefix(self.index.pkg + '.')}.{cls[1].name + '.' if cls else ''}{fn.name}"

    def holds(self, node, names: set, carriers: dict):
        """What an expression holds: a Carrier, True (the object or a part of it) or None."""
        if isinstance(node, (ast.IfExp, ast.BoolOp)):  # `a if c else b`, `a or b`: either side
            sides = [node.body, node.orelse] if isinstance(node, ast.IfExp) else node.values
            return next((h for h in (self.holds(n, names, carriers) for n in sides) if h), None)
        if isinstance(node, (ast.Subscript, ast.Starred)):  # cfg["_target_"]: a part
            return True if self.holds(node.value, names, carriers) else None
        d = dotted(node)
        if d in carriers:
            return carriers[d]
        return True if d and any(d == n or d.startswith(n + ".") for n in names) else None

    def carry(self, name: str, carrier: Carrier, names: set, carriers: dict) -> None:
        """`name` holds a carrier: track it, the attributes on it that hold a part, and the carriers on it."""
        carriers[name] = carrier
        names.update(f"{name}.{a}" for a in carrier.attrs)
        for attr, sub in carrier.subs.items():
            self.carry(f"{name}.{attr}", sub, names, carriers)

    def callee(self, module: str, fn, cls, call, carriers: dict):
        """The target of a call: (module, def, class, receiver carrier, first parameter bound), or None."""
        me, func = fn.args.args[0].arg if cls and fn.args.args else None, call.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call) and dotted(func.value.func) == "super":
            return cls and (hit := self.index.method(cls, func.attr, own=False)) and (*hit, carriers.get(me), True)
        if me and isinstance(func, ast.Attribute) and dotted(func.value) == me:  # self.method(...)
            return (hit := self.index.method(cls, func.attr)) and (*hit, carriers.get(me), True)
        if isinstance(func, ast.Attribute) and isinstance(c := self.holds(func.value, set(), carriers), Carrier):
            return (hit := self.index.method(c.cls, func.attr)) and (*hit, c, True)  # self.x.method(): x = Klass()
        found = dotted(func) and self.index.resolve(module, dotted(func))
        if not found or found[0] == "module":
            return None
        if isinstance(found[1], ast.ClassDef):  # Klass(...): its __init__
            return (hit := self.index.method(found, "__init__")) and (*hit, None, True)
        if len(found) == 3:  # Klass.method(...): bound for a classmethod only
            return (*found, None, "classmethod" in map(dotted, found[1].decorator_list))
        return (*found, None, None, False)

    def bind(self, call, target, names: set, carriers: dict):
        """The callee's tracked names and carriers, from the call's arguments (and its receiver)."""
        fn, receiver, bound = target[1], target[3], target[4]
        params, new_names, new_carriers = [a.arg for a in fn.args.posonlyargs + fn.args.args], set(), {}
        if bound and params:
            if receiver is not None:
                self.carry(params[0], receiver, new_names, new_carriers)
            params = params[1:]
        rest, named = fn.args.vararg and fn.args.vararg.arg, set(params) | {a.arg for a in fn.args.kwonlyargs}
        pairs = [(params[i] if i < len(params) else rest, a) for i, a in enumerate(call.args)]
        pairs += [(k.arg if k.arg in named else fn.args.kwarg and fn.args.kwarg.arg, k.value) for k in call.keywords]
        for param, arg in pairs:
            held = param and self.holds(arg, names, carriers)
            if isinstance(held, Carrier):
                self.carry(param, held, new_names, new_carriers)
            elif held:
                new_names.add(param)
        return new_names, new_carriers

    def state(self, target, names: set, carriers: dict):
        """Add what the function's assignments track (`t = cfg.trainer`, `self.cfg = cfg`, `self.x = Klass(cfg)`);
        at the end of an __init__, `self` is a carrier if it keeps a part of the object."""
        module, fn, cls = target[:3]
        for node in in_order(fn, (ast.Assign, ast.AnnAssign)):
            for lhs_all in getattr(node, "targets", [getattr(node, "target", None)]):
                pairs = [(lhs_all, node.value)]
                if isinstance(lhs_all, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs = zip(lhs_all.elts, node.value.elts)
                for lhs, value in pairs:
                    held = self.holds(value, names, carriers)
                    if held is None and isinstance(value, ast.Call):
                        held = self.built(module, fn, cls, value, names, carriers)
                    if dotted(lhs) and isinstance(held, Carrier):
                        self.carry(dotted(lhs), held, names, carriers)
                    elif dotted(lhs) and held:
                        names.add(dotted(lhs))
        if cls and fn.name == "__init__" and fn.args.args:
            me = fn.args.args[0].arg + "."
            attrs = {n.removeprefix(me) for n in names if n.startswith(me) and n.count(".") == 1}
            subs = {k.removeprefix(me): c for k, c in carriers.items() if k.startswith(me) and k.count(".") == 1}
            if attrs or subs:
                carriers[me[:-1]] = Carrier(cls, attrs, subs)
        return names, carriers

    def built(self, module: str, fn, cls, call, names: set, carriers: dict):
        """The Carrier that `Klass(...)` makes, when its __init__ keeps a part of the object on self."""
        target = self.callee(module, fn, cls, call, carriers)
        if not target or target[1].name != "__init__" or (key := self.key(*target[:3])) in self.building:
            return None
        self.building.add(key)
        new_names, new_carriers = self.bind(call, target, names, carriers)
        if new_names or new_carriers:
            new_carriers = self.state(target, new_names, new_carriers)[1]
        self.building.discard(key)
        return new_carriers.get(target[1].args.args[0].arg)

    def visit(self, target, names: set, carriers: dict, depth: int = 0) -> None:
        module, fn, cls = target[:3]
        self.seen.add(key := self.key(module, fn, cls))
        self.order.append((key, module.removeprefix(self.index.pkg + "."), depth))
        names, carriers = self.state(target, names, carriers)
        for call in in_order(fn, ast.Call):
            callee = self.callee(module, fn, cls, call, carriers)
            if callee and self.key(*callee[:3]) not in self.seen:
                new_names, new_carriers = self.bind(call, callee, names, carriers)
                if new_names or new_carriers:
                    self.visit(callee, new_names, new_carriers, depth + 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("package", nargs="?", type=Path, default=Path(__file__).resolve().parent.parent / "ddp_lab")
    parser.add_argument("--name", choices=["cfg", "env"], action="append", help="default: both")
    parser.add_argument("--list", action="store_true", help="the visited functions in order, with their layers")
    args = parser.parse_args()
    index = Index(args.package.resolve())
    trainer = next((m, d["Trainer"]) for m, (d, _) in index.mods.items() if isinstance(d.get("Trainer"), ast.ClassDef))
    for name in args.name or ["cfg", "env"]:
        walk = Walk(index)
        walk.visit(index.method(trainer, "__init__"), {name}, {})
        modules = [m for _, m, _ in walk.order]
        layers = [layer(m) for m in modules]
        up = sum(1 for a, b in zip(layers, layers[1:]) if a is not None and b is not None and b < a)
        runs = [m for i, m in enumerate(modules) if i == 0 or m != modules[i - 1]]
        back = sum(1 for i, m in enumerate(runs) if m in runs[:i])
        print(f"{name}: {len(walk.order)} functions in {len(set(modules))} modules; {up} returns up a layer; "
              f"{back} returns to a module left")
        for (key, _, depth), number in zip(walk.order, layers) if args.list else ():
            print(f"  {'?' if number is None else number}  {'  ' * depth}{key}")


if __name__ == "__main__":
    main()
