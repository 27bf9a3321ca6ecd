"""The registries of quantgate's extension points: build engines, suite kinds and numerics formats
(weights, activations, KV cache).

One registration path for all five. A new entry is one module: inside quantgate, a function or
class decorated with the registry's decorator (``@register("name")`` for engines and suite kinds,
``@register_weights`` / ``@register_activation`` / ``@register_kv_cache`` for formats) in its
stage's package; from outside, the same module in an installed distribution that names it under
the registry's entry point group (``name = module:attr``). Nothing here is edited.

Each registry lives in its stage (``quantize.engines.ENGINES``, ``evaluate.suites.KINDS``,
``numerics.weights.WEIGHT_FORMATS``, ``numerics.formats.ACTIVATION_FORMATS`` and
``KV_CACHE_FORMATS``); the suite kinds' declarations have one below configuration
(``declarations.SUITE_KINDS``). Names are known before anything is imported: quantgate's own are
read from the decorators in the stage's package (``declared``: ``ast``, on the first lookup), a
plugin's from its distribution's metadata, and the module is imported when its name is first used.
Configuration checks names against ``quantgate.declarations`` alone and imports no stage.
Every entry is checked against its extension point's protocol as it is registered, so a plugin
that lacks a method is refused by name, not met later as an AttributeError.

Plugins load under a guard (``load_plugin``): whatever a plugin's import does (raises, names a
module or attribute that is not there, or calls ``sys.exit``, which used to end ``quantgate gate``
with exit 0, no report and no error, a pass to any CI job reading the exit code) is a
ConfigFileError (exit 2) in one line naming the entry point and its distribution. The command
line loads every installed plugin that way before any work (``check_plugins``), and refuses one
name given by two distributions, naming both (one used to be taken silently). Not guarded: a
plugin that ends the interpreter itself (``os._exit``) or blocks forever on import.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Iterable
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, TypeVar

from typing_extensions import get_protocol_members, is_protocol

from quantgate.runtime.errors import ConfigFileError
from quantgate.runtime.registry import Registry

_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # src/quantgate: runtime/ is one level down
T = TypeVar("T")


def declared(
    directory: Path, package: str, what: str = "engine", decorator: str = "register"
) -> dict[str, str]:
    """``name -> module`` for every ``@<decorator>("name", ...)`` in ``directory``'s modules, read
    without importing (``@register("x")`` also matches ``@ENGINES.register("x")``)."""
    found: dict[str, str] = {}
    for path in sorted(directory.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        if f"{decorator}(" not in text:
            continue
        for node in ast.walk(ast.parse(text, str(path))):
            if not isinstance(node, ast.ClassDef | ast.FunctionDef):
                continue
            for expr in node.decorator_list:
                name = _registered_name(expr, decorator)
                if name is None:
                    continue
                module = f"{package}.{path.stem}"
                if found.get(name, module) != module:
                    raise ValueError(f"{what} {name!r} is registered in both {found[name]} and {module}")
                found[name] = module
    return found


def _registered_name(expr: ast.expr, decorator: str) -> str | None:
    """The name in ``@decorator("x", ...)`` or ``@X.decorator("x", ...)``; None for any other decorator."""
    if not (isinstance(expr, ast.Call) and len(expr.args) == 1):
        return None
    func, arg = expr.func, expr.args[0]
    called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if called != decorator or not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
        return None
    return arg.value


def refusal(entry: object, protocol: type, decorator: str = "its decorator") -> tuple[str, str] | None:
    """Why ``entry`` cannot serve as ``protocol`` (the problem and its fix), or None when it can.

    A ``typing.Protocol``: a class with every member; an abstract base class: a subclass with no
    abstract method left; any other class: an instance of it (a format's record)."""
    spec = f"{protocol.__module__}.{protocol.__qualname__}"
    if is_protocol(protocol):
        if not isinstance(entry, type):
            return f"is {_kind(entry)}, not a class", f"register a class that implements {spec}"
        missing = sorted(m for m in get_protocol_members(protocol) if not hasattr(entry, m))
    elif inspect.isabstract(protocol):
        if not (isinstance(entry, type) and issubclass(entry, protocol)):
            return f"is {_kind(entry)}, not a subclass of {spec}", f"derive it from {spec}"
        missing = sorted(getattr(entry, "__abstractmethods__", ()))
    elif not isinstance(entry, protocol):
        return f"is {_kind(entry)}, not a {protocol.__qualname__}", f"decorate it with {decorator}"
    else:
        return None
    if not missing:
        return None
    methods = ", ".join(f"{m}()" for m in missing)
    return f"does not implement {methods}, which {spec} requires", f"define {methods} on {entry.__qualname__}"


def _kind(entry: object) -> str:
    return f"the class {entry.__qualname__}" if isinstance(entry, type) else f"a {type(entry).__name__}"


def _origin(entry: object) -> str:
    """``module:qualname`` of a class or function; else the entry's type."""
    module, qualname = getattr(entry, "__module__", None), getattr(entry, "__qualname__", None)
    return f"{module}:{qualname}" if module and qualname else type(entry).__qualname__


def _distribution(entry_point: EntryPoint) -> str:
    """The distribution that declares ``entry_point``, as pip names it (name and version)."""
    dist = entry_point.dist
    return f"{dist.name} {dist.version}" if dist is not None else "an unknown distribution"


def _where(entry_point: EntryPoint) -> str:
    return (
        f"entry point '{entry_point.name} = {entry_point.value}' in group {entry_point.group} "
        f"(distribution {_distribution(entry_point)})"
    )


def _uninstall(entry_point: EntryPoint) -> str:
    name = entry_point.dist.name if entry_point.dist is not None else "the plugin's distribution"
    return f"fix the plugin, or uninstall it (pip uninstall {name})"


def load_plugin(entry_point: EntryPoint) -> Any:
    """What ``entry_point`` names, imported under the guard (see the module docstring)."""
    try:
        found: Any = importlib.import_module(entry_point.module)
    except SystemExit as exc:  # a plugin must not end the command, least of all with exit 0
        problem = f"the plugin's import called sys.exit({exc.code!r})"
    except ModuleNotFoundError as exc:
        problem = f"the plugin's module or one it imports is not installed ({exc.name})"
    except Exception as exc:  # noqa: BLE001  a plugin's import may raise anything; each is this one refusal
        first = (str(exc).splitlines() or [""])[0][:200]
        problem = f"the plugin's import raised {type(exc).__name__}" + (f": {first}" if first else "")
    else:
        for part in (entry_point.attr or "").split(".") if entry_point.attr else ():
            if not hasattr(found, part):
                problem = f"module {entry_point.module} has no attribute '{entry_point.attr}'"
                break
            found = getattr(found, part)
        else:
            return found
    raise ConfigFileError(_where(entry_point), f"cannot load: {problem}", _uninstall(entry_point))


def installed(what: str, group: str) -> dict[str, EntryPoint]:
    """The installed entry points of ``group`` by name; one name from two distributions is a
    ConfigFileError naming both."""
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=group):
        other = found.get(ep.name)
        if other is not None and _distribution(other) != _distribution(ep):
            raise ConfigFileError(
                f"entry point group {group}",
                f"{what} '{ep.name}' is given by two distributions, {_distribution(other)} "
                f"({other.value}) and {_distribution(ep)} ({ep.value})",
                "uninstall one of them, or rename its entry point",
            )
        found[ep.name] = ep
    return found


class PluginRegistry(Registry[T]):
    """A registry whose names are quantgate's own (the ``@decorator("name")`` in ``package``'s
    modules, read on the first lookup and imported on first use), then the installed
    distributions' entry points of ``group`` (``name = module:attr``), looked up when a name is not
    found (so a plugin installed, or put on sys.path, after quantgate was imported is still found).
    A built-in name always wins. Every entry is checked against ``protocol`` (``"module:attr"``,
    imported at the first registration) as it is added: a ConfigFileError names the entry, where
    it comes from and what it lacks."""

    def __init__(self, what: str, group: str, package: str, decorator: str, protocol: str) -> None:
        where = package.replace(".", "/")
        super().__init__(
            what, how_to_add=f"@{decorator} in a module under {where}, or a '{group}' entry point"
        )
        self.group, self.package, self.decorator, self.protocol = group, package, decorator, protocol
        self._declared = False

    def _own(self) -> None:
        """Read quantgate's own names, once, on the first lookup."""
        if not self._declared:
            directory = _PACKAGE_DIR.joinpath(*self.package.split(".")[1:])
            self._lazy.update(declared(directory, self.package, self.what, self.decorator))
            self._declared = True

    def _plugins(self) -> dict[str, EntryPoint]:
        return installed(self.what, self.group)

    def load_plugins(self) -> None:
        """Load every installed plugin of this extension point under the guard."""
        plugins = self._plugins()
        if plugins:
            self._own()
        for name, plugin in plugins.items():
            if name not in super().names():  # a built-in name always wins: the plugin is never used
                load_plugin(plugin)

    def add(self, name: str, entry: T, origin: str | None = None) -> None:
        """Register ``entry`` as ``name`` once it conforms to the protocol; else a ConfigFileError."""
        module, _, attr = self.protocol.partition(":")
        why = refusal(entry, getattr(importlib.import_module(module), attr), f"@{self.decorator}")
        if why is not None:
            problem, fix = why
            raise ConfigFileError(origin or _origin(entry), f"{self.what} '{name}' {problem}", fix)
        super().add(name, entry)

    def names(self) -> list[str]:
        """Built-in entries and installed entry points, sorted."""
        self._own()
        return sorted({*super().names(), *self._plugins()})

    def get(self, name: str, where: object = None) -> T:
        """The entry ``name``: built in, else loaded from its entry point; else a ConfigFileError."""
        self._own()
        if name not in super().names():
            plugin = self._plugins().get(name)
            if plugin is not None:
                loaded: Any = load_plugin(plugin)  # its module may have registered it itself (a format)
                if name not in self._entries:
                    self.add(name, loaded, f"entry point {name} = {plugin.value}")
        return super().get(name, where)


def check_plugins(points: Iterable[Any]) -> None:
    """Load every installed plugin of every extension point under the guard: the command line's
    first act, so that a plugin that cannot load is exit 2, naming it, before any work. ``points``:
    anything with ``load_plugins()`` (a ``PluginRegistry``, a ``declarations.Declared``)."""
    for point in points:
        point.load_plugins()
