"""The registries of the extension points whose names configuration validates: build engines and
suite kinds.

A recipe names an engine and a suite YAML a kind; ``quantgate.config`` must refuse a name that
does not exist before any build, yet sits below the stages that implement them. So the registries
live here, below config, and hold names: each entry is the module that registers it, found by
reading the decorators in the stage's package (``declared``: ``ast``, nothing imported) and
imported on first use. A new engine or suite kind is one module with ``@register("name")`` in its
package, or, from outside quantgate, an entry point of an installed distribution
(``quantgate.engines``, ``quantgate.suite_kinds``: ``name = module:Class``); nothing here is edited. Numerics formats register eagerly in ``quantgate.numerics`` (no configuration names them
before numerics is imported).
"""

from __future__ import annotations

import ast
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from quantgate.registry import Registry

if TYPE_CHECKING:
    from quantgate.evaluate import SuiteKind

_PACKAGE_DIR = Path(__file__).resolve().parent
T = TypeVar("T")


def declared(directory: Path, package: str, what: str = "engine") -> dict[str, str]:
    """``name -> module`` for every ``@register("name")`` in ``directory``'s modules, read without importing."""
    found: dict[str, str] = {}
    for path in sorted(directory.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        if "register(" not in text:
            continue
        for node in ast.walk(ast.parse(text, str(path))):
            if not isinstance(node, ast.ClassDef | ast.FunctionDef):
                continue
            for decorator in node.decorator_list:
                name = _registered_name(decorator)
                if name is None:
                    continue
                module = f"{package}.{path.stem}"
                if found.get(name, module) != module:
                    raise ValueError(f"{what} {name!r} is registered in both {found[name]} and {module}")
                found[name] = module
    return found


def _registered_name(decorator: ast.expr) -> str | None:
    """The name in ``@register("x")`` or ``@ENGINES.register("x")``; None for any other decorator."""
    if not (isinstance(decorator, ast.Call) and len(decorator.args) == 1):
        return None
    func, arg = decorator.func, decorator.args[0]
    called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if called != "register" or not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
        return None
    return arg.value


class PluginRegistry(Registry[T]):
    """A registry whose names are quantgate's own (lazy modules), then the installed distributions'
    entry points of ``group`` (``name = module:attr``), looked up when a name is not found (so a
    plugin installed, or put on sys.path, after quantgate was imported is still found). A built-in
    name always wins. One way in for engines and suite kinds alike, from inside or outside."""

    def __init__(self, what: str, group: str, lazy: dict[str, str], how_to_add: str) -> None:
        super().__init__(what, lazy=lazy, how_to_add=f"{how_to_add}, or a '{group}' entry point")
        self.group = group

    def _plugins(self) -> dict[str, EntryPoint]:
        return {ep.name: ep for ep in entry_points(group=self.group)}

    def names(self) -> list[str]:
        """Built-in entries and installed entry points, sorted."""
        return sorted({*super().names(), *self._plugins()})

    def get(self, name: str, where: object = None) -> T:
        """The entry ``name``: built in, else loaded from its entry point; else a ConfigFileError."""
        if name not in super().names():
            plugin = self._plugins().get(name)
            if plugin is not None:
                self.add(name, plugin.load())
        return super().get(name, where)


ENGINES: PluginRegistry[type] = PluginRegistry(
    "engine",
    "quantgate.engines",
    lazy=declared(_PACKAGE_DIR / "quantize" / "engines", "quantgate.quantize.engines"),
    how_to_add="@register in a module under quantgate/quantize/engines",
)

SUITE_KIND_ENTRY_POINTS = "quantgate.suite_kinds"
SUITE_KINDS: PluginRegistry[type[SuiteKind]] = PluginRegistry(
    "suite kind",
    SUITE_KIND_ENTRY_POINTS,
    lazy=declared(_PACKAGE_DIR / "evaluate" / "suites", "quantgate.evaluate.suites", what="suite kind"),
    how_to_add="@register in a module under quantgate/evaluate/suites",
)
