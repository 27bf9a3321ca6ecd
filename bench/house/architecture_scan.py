"""How well src/quantgate keeps the layers docs/ARCHITECTURE.md draws (issue 26's figures).

Usage:  .venv/bin/python bench/house/architecture_scan.py [--root TREE] [--list]

Reads the source as text (``ast``; nothing is imported, so any checkout can be measured, e.g. a
worktree of an older commit) and prints one line per figure:

- cross-stage private imports: an import that runs (at any depth of a module, function-local
  ones included; not those under ``if TYPE_CHECKING:``, which name types and never run), by one stage or by a top-level module of another stage's module or of a name its
  ``__init__`` does not list in ``__all__``. A stage is a package directly under
  ``src/quantgate``; ``config`` counts as one like the others, ``stats``, ``declarations``,
  ``contracts`` and ``runtime`` do not (libraries of public modules below every stage:
  ``stats.bounds``, a suite kind's declaration ``declarations.suite_kinds.text``,
  ``contracts.artifact``, ``runtime.atomic``). pyproject's import-linter
  contracts check the same rule (tests/unit/test_layers.py); this script counts, for a table.
- cycles: the strongly connected groups of the stage graph (top-level modules are one node each)
  of the same imports, and the stage pairs that import each other.
- functions over 80 lines (``def`` to its last line) and the largest module.
- the house drawn module by module with every arrow, not only the imports that run: those under
  ``if TYPE_CHECKING:`` and those made by string (a constant naming a quantgate module,
  ``"quantgate.x.y"`` or ``"quantgate.x.y:Name"``, as ``importlib.import_module`` and the plugin
  registries take them, and the modules a plugin registry imports by its decorator's names;
  import-linter sees neither kind, the layer test does, through this module).
  ``from quantgate.pkg import Name`` points at the module ``pkg/__init__`` takes ``Name`` from. Its
  figures: circles (groups of more than one module that reach each other), the largest one's
  size, arrows running back up (an import of a module in a higher layer of pyproject's layers
  contract), modules at the package root, and the largest room (a package of src/quantgate, the
  root modules together, or bench/ or scripts/, by lines).

``--list`` prints every private import and every long function as well, and every circle and
arrow running back up.
"""

from __future__ import annotations

import argparse
import ast
import re
import tomllib
from collections import defaultdict
from pathlib import Path

PACKAGE = "quantgate"


def modules(src: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package."""
    out = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def exported(mods: dict[str, Path], package: str) -> set[str]:
    """The names a package's ``__init__`` lists in ``__all__``."""
    path = mods.get(package)
    if path is None or path.name != "__init__.py":
        return set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            return {e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)}
    return set()


def node_of(module: str) -> str:
    """The stage (``quantgate.<package>``) a module belongs to, or the module itself at top level."""
    parts = module.split(".")
    return ".".join(parts[:2])


def runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` except what lies under ``if TYPE_CHECKING:``."""
    out, stack = [], [tree]
    while stack:
        node = stack.pop()
        out.append(node)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))
    return out


def imports(mods: dict[str, Path], module: str) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every quantgate import of a module that runs."""
    tree = ast.parse(mods[module].read_text())
    is_package = mods[module].name == "__init__.py"
    out: list[tuple[str, str | None, int]] = []
    for node in runtime_nodes(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, None, node.lineno) for a in node.names if a.name.split(".")[0] == PACKAGE]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.append((sub, None, node.lineno) if sub in mods else (base, alias.name, node.lineno))
    return out


# libraries of public modules below every stage: each module is imported by its own path
LIBRARIES = {"quantgate.stats", "quantgate.declarations", "quantgate.contracts", "quantgate.runtime"}


def private_imports(mods: dict[str, Path]) -> list[str]:
    """Every import of another stage's module, or of a name its ``__init__`` does not export."""
    stages = {m for m in mods if m.count(".") == 1 and mods[m].name == "__init__.py"} - LIBRARIES
    found = []
    for module, path in mods.items():
        for target, name, line in imports(mods, module):
            stage = node_of(target)
            if stage not in stages or stage == node_of(module):
                continue
            public = target == stage and (name is None or name in exported(mods, stage))
            if not public:
                what = target + (f".{name}" if name else "")
                found.append(f"{path}:{line}: {module} -> {what}")
    return found


def stage_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Stage (or top-level module) -> the stages and top-level modules it imports."""
    graph: dict[str, set[str]] = defaultdict(set)
    for module in mods:
        src = node_of(module)
        graph[src] |= {node_of(t) for t, _, _ in imports(mods, module) if node_of(t) not in (src, PACKAGE)}
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's groups of more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in list(graph):
        if v not in index:
            visit(v)
    return groups


def long_functions(mods: dict[str, Path], limit: int = 80) -> list[str]:
    """Every function or method longer than ``limit`` lines."""
    found = []
    for module, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > limit:
                    found.append(f"{module}.{node.name} ({length} lines)")
    return found


# calls that import the module a string names, or hand it to what will
LOADERS = {"import_module", "find_spec", "PluginRegistry", "Registry", "EntryPoint", "lazy_exports"}


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


_NAMED = re.compile(r"quantgate(\.\w+)+(:[\w.]+)?")


def every_import(mods: dict[str, Path], module: str) -> list[tuple[str, int, str]]:
    """(imported module, line, how) for every quantgate import of ``module``: ``run`` (executed),
    ``type`` (under ``if TYPE_CHECKING:``) or ``string`` (a constant naming a module)."""
    tree = ast.parse(mods[module].read_text())
    running = {id(n) for n in runtime_nodes(tree)}
    out: list[tuple[str, int, str]] = []
    passed = {
        id(a)
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and _callee(n) in LOADERS
        for a in [*n.args, *(k.value for k in n.keywords)]
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            how = "run" if id(node) in running else "type"
            for target, _, line in _resolved(mods, module, node):
                out.append((target, line, how))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _NAMED.fullmatch(node.value):
            named, _, attr = node.value.partition(":")
            # a module handed to what imports it (import_module, a registry) or a "module:attr"
            # reference; not a tag, a log label or a metric name that happens to read like one
            if named in mods and (attr or id(node) in passed):
                out.append((named, node.lineno, "string"))
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and _callee(call) == "PluginRegistry" and len(call.args) >= 4:
            out += [(m, call.lineno, "string") for m in _registered(mods, module, call.args[2], call.args[3])]
    return out


def _registered(mods: dict[str, Path], module: str, package: ast.expr, decorator: ast.expr) -> list[str]:
    """The modules a plugin registry imports by name: those of its package that use its decorator
    (``@decorator("name")``); the package given as a constant, ``__name__`` or its parent."""
    if isinstance(package, ast.Constant):
        name = str(package.value)
    elif isinstance(package, ast.Name) and package.id == "__name__":
        name = module
    elif "__name__" in ast.unparse(package):
        name = module.rpartition(".")[0]
    else:
        return []
    if not isinstance(decorator, ast.Constant) or name not in mods:
        return []
    return [
        m
        for m, path in mods.items()
        if m.rpartition(".")[0] == name and f"{decorator.value}(" in path.read_text()
    ]


def _resolved(mods: dict[str, Path], module: str, node: ast.AST) -> list[tuple[str, str | None, int]]:
    """The modules one import statement reaches: ``from pkg import Name`` is the module that
    ``pkg/__init__`` takes ``Name`` from, where it names one."""
    is_package = mods[module].name == "__init__.py"
    found: list[tuple[str, str | None, int]] = []
    if isinstance(node, ast.Import):
        return [(a.name, None, node.lineno) for a in node.names if a.name in mods]
    assert isinstance(node, ast.ImportFrom)
    base = node.module or ""
    if node.level:
        anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
        base = ".".join(anchor + ([base] if base else []))
    if base.split(".")[0] != PACKAGE:
        return []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if sub in mods:
            found.append((sub, None, node.lineno))
        elif base in mods:
            found.append((_source_of(mods, base, alias.name), alias.name, node.lineno))
    return found


def _source_of(mods: dict[str, Path], package: str, name: str) -> str:
    """The module a package's ``__init__`` imports ``name`` from (its lazy exports name it under
    ``if TYPE_CHECKING:``), or the package itself."""
    if mods[package].name != "__init__.py":
        return package
    for node in ast.walk(ast.parse(mods[package].read_text())):
        if (
            isinstance(node, ast.ImportFrom)
            and not node.level
            and node.module in mods
            and node.module != package
            and any(a.name == name for a in node.names)
        ):
            return str(node.module)
    return package


def layer_of(pyproject: Path) -> dict[str, int]:
    """Top-level package or module -> its layer (0 the top) in the layers contract."""
    config = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")["layers"]
    out = {}
    for i, layer in enumerate(layers):
        for name in re.split(r"[|:]", layer):
            out[f"{PACKAGE}.{name.strip().strip('()')}"] = i
    return out


def house(root: Path, mods: dict[str, Path]) -> dict[str, object]:
    """The module graph with every arrow (run, type, string) and its figures."""
    graph: dict[str, set[str]] = defaultdict(set)
    arrows: list[tuple[str, str, int, str]] = []
    for module in mods:
        graph[module]
        for target, line, how in every_import(mods, module):
            if target != module:
                graph[module].add(target)
                arrows.append((module, target, line, how))
    layers = layer_of(root / "pyproject.toml")
    up = sorted(
        {
            f"{mods[a].relative_to(root)}:{line}: {a} -> {b} ({how})"
            for a, b, line, how in arrows
            if node_of(a) in layers and node_of(b) in layers and layers[node_of(b)] < layers[node_of(a)]
        }
    )
    circles = sorted(strongly_connected(graph), key=len, reverse=True)
    rooms: dict[str, int] = defaultdict(int)
    for module, path in mods.items():
        room = node_of(module) if path.parent != root / "src" / PACKAGE else f"{PACKAGE} (root modules)"
        rooms[room] += len(path.read_text().splitlines())
    for extra in ("bench", "scripts"):
        rooms[extra] = sum(len(p.read_text().splitlines()) for p in (root / extra).rglob("*.py"))
    at_root = [p for p in (root / "src" / PACKAGE).glob("*.py") if p.name != "__init__.py"]
    return {
        "circles": circles,
        "up": up,
        "at_root": len(at_root),
        "rooms": rooms,
        "kinds": {how: sum(1 for *_, h in arrows if h == how) for how in ("run", "type", "string")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2])
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args()
    mods = modules(args.root / "src")
    private = private_imports(mods)
    graph = stage_graph(mods)
    groups = strongly_connected(graph)
    pairs = sorted({tuple(sorted((a, b))) for a in graph for b in graph[a] if a in graph.get(b, ())})
    longs = long_functions(mods)
    largest = max(mods.items(), key=lambda kv: len(kv[1].read_text().splitlines()))
    print(f"cross-stage private imports: {len(private)}")
    print(f"cycles (groups of stages): {len(groups)} {[' '.join(g) for g in groups]}")
    print(f"mutually importing pairs: {len(pairs)} {[' <-> '.join(p) for p in pairs]}")
    print(f"functions over 80 lines: {len(longs)}")
    print(
        f"largest module: {largest[1].relative_to(args.root)} ({len(largest[1].read_text().splitlines())} lines)"
    )
    drawn = house(args.root, mods)
    circles, rooms = drawn["circles"], drawn["rooms"]
    assert isinstance(circles, list) and isinstance(rooms, dict)
    total = sum(rooms.values())
    room, lines = max(rooms.items(), key=lambda kv: kv[1])
    print(f"arrows drawn (run / type-only / by string): {drawn['kinds']}")
    print(f"circles (modules that reach each other): {len(circles)}")
    print(f"largest circle: {max((len(c) for c in circles), default=0)} modules")
    print(f"arrows running back up: {len(drawn['up'])}")  # type: ignore[arg-type]
    print(f"modules at the root: {drawn['at_root']}")
    print(f"largest room: {room} ({lines} lines, {100 * lines / total:.0f} % of {total})")
    if args.list:
        print("\n".join(["", *private, "", *longs]))
        for circle in circles:
            print(f"circle of {len(circle)}: {' '.join(circle)}")
        print("\n".join(drawn["up"]))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
