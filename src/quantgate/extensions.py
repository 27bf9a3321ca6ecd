"""The registries of quantgate's extension points: build engines, suite kinds and numerics formats
(weights, activations, KV cache).

One registration path for all five. A new entry is one module: inside quantgate, a function or
class decorated with the registry's decorator (``@register("name")`` for engines and suite kinds,
``@register_weights`` / ``@register_activation`` / ``@register_kv_cache`` for formats) in its
stage's package; from outside, the same module in an installed distribution that names it under
the registry's entry point group (``name = module:attr``). Nothing here is edited.

Names are known before anything is imported: quantgate's own are read from the decorators in the
stage's package (``declared``: ``ast``, on the first lookup), a plugin's from its distribution's
metadata, and the module is imported when its name is first used. So configuration (which sits
below the stages) can refuse an engine or suite kind that does not exist without importing one.
Every entry is checked against its extension point's protocol as it is registered, so a plugin
that lacks a method is refused by name, not met later as an AttributeError.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from typing_extensions import get_protocol_members, is_protocol

from quantgate.errors import ConfigFileError
from quantgate.registry import Registry

if TYPE_CHECKING:
    from quantgate.evaluate import SuiteKind
    from quantgate.numerics.formats import ActivationFormat, KVCacheFormat
    from quantgate.numerics.weights import WeightFormat

_PACKAGE_DIR = Path(__file__).resolve().parent
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
        return {ep.name: ep for ep in entry_points(group=self.group)}

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
                loaded: Any = plugin.load()  # its module may have registered it itself (a format)
                if name not in self._entries:
                    self.add(name, loaded, f"entry point {name} = {plugin.value}")
        return super().get(name, where)


ENGINES: PluginRegistry[type] = PluginRegistry(
    "engine",
    "quantgate.engines",
    "quantgate.quantize.engines",
    "register",
    "quantgate.quantize.engines:Engine",
)
SUITE_KIND_ENTRY_POINTS = "quantgate.suite_kinds"
SUITE_KINDS: PluginRegistry[type[SuiteKind]] = PluginRegistry(
    "suite kind",
    SUITE_KIND_ENTRY_POINTS,
    "quantgate.evaluate.suites",
    "register",
    "quantgate.evaluate.suites:SuiteKind",
)
WEIGHT_FORMATS: PluginRegistry[WeightFormat] = PluginRegistry(
    "weight format",
    "quantgate.weight_formats",
    "quantgate.numerics",
    "register_weights",
    "quantgate.numerics.weights:WeightFormat",
)
ACTIVATION_FORMATS: PluginRegistry[ActivationFormat] = PluginRegistry(
    "activation format",
    "quantgate.activation_formats",
    "quantgate.numerics",
    "register_activation",
    "quantgate.numerics.formats:ActivationFormat",
)
KV_CACHE_FORMATS: PluginRegistry[KVCacheFormat] = PluginRegistry(
    "KV cache format",
    "quantgate.kv_cache_formats",
    "quantgate.numerics",
    "register_kv_cache",
    "quantgate.numerics.formats:KVCacheFormat",
)
