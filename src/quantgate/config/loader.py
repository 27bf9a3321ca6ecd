"""Load YAML config files into validated, immutable pydantic models.

Why not plain ``model_validate(yaml.safe_load(...))``: a pydantic error says *which field*,
not *which line of which file*, and a typo like ``kv_cahe`` deserves "did you mean
``kv_cache``?". This loader keeps the YAML node tree so that every validation error reads
``file:line: problem (did you mean ...)``. A top-level ``include: [other.yaml]`` merges those
files first (relative to the including file, whose own keys win; inside the project, no loops).
Every file is read within the bounds of ``bounded_yaml``; safe loader only: no code runs from
config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from quantgate.config import bounded_yaml
from quantgate.runtime.errors import ConfigFileError
from quantgate.runtime.suggest import nearest

M = TypeVar("M", bound=BaseModel)
MAX_FILES = 32  # one config and everything it includes


def _node_for(root: yaml.Node | None, loc: tuple[Any, ...]) -> yaml.Node | None:
    """Walk a composed YAML node tree along a pydantic error location."""
    node = root
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if k.value == str(part)), None)
            if match is None:
                # the key itself is the problem (e.g. an extra key): point at the key
                key = next((k for k, _ in node.value if k.value == str(part)), None)
                return key or node
            node = match
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                return node
            node = node.value[part]
        else:
            return node
    return node


def _key_node(root: yaml.Node | None, loc: tuple[Any, ...]) -> yaml.Node | None:
    parent = _node_for(root, loc[:-1])
    if isinstance(parent, yaml.MappingNode):
        for k, _ in parent.value:
            if k.value == str(loc[-1]):
                return k
    return parent


def _allowed_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names of the sub-model at ``loc`` (best effort, for suggestions)."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int) or not (isinstance(current, type) and issubclass(current, BaseModel)):
            continue
        field = current.model_fields.get(str(part))
        if field is None:
            # a dict[str, Model] level: keep the same value type
            continue
        annotation = field.annotation
        args = getattr(annotation, "__args__", ())
        inner = next(
            (a for a in (annotation, *args) if isinstance(a, type) and issubclass(a, BaseModel)), None
        )
        if inner is None:
            inner = next(
                (
                    b
                    for a in args
                    for b in getattr(a, "__args__", ())
                    if isinstance(b, type) and issubclass(b, BaseModel)
                ),
                None,
            )
        current = inner or current
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def read_yaml(path: Path) -> tuple[dict[str, Any], yaml.Node | None]:
    """Parse one YAML file (with its includes) into data and its own node tree.

    Every file is read by ``bounded_yaml`` (a regular file, size, depth, aliases, numbers). An
    include is a path relative to the including file that must stay inside the project (the
    nearest folder up holding gates.yaml and targets/, else the top file's folder); a file that
    includes itself through any chain is refused, and one load reads at most ``MAX_FILES`` files
    holding at most ``bounded_yaml.MAX_VALUES`` values in all."""
    path = Path(path)
    start = _resolved(path, str(path)).parent
    return _Reads(project_of(start) or start).read(path, ())


class _Reads:
    """One load: where includes may point, and what the files read so far cost."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files = 0
        self.values = 0

    def read(self, path: Path, chain: tuple[Path, ...]) -> tuple[dict[str, Any], yaml.Node | None]:
        self.files += 1
        data, node, values = bounded_yaml.parse(path)
        self.values += values
        if self.values > bounded_yaml.MAX_VALUES:
            raise ConfigFileError(
                path,
                f"with its includes, this config holds more than {bounded_yaml.MAX_VALUES:,} values",
                "include fewer or smaller files",
            )
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigFileError(
                path, "expected a mapping at the top level", "write the file as key: value pairs"
            )
        includes = data.pop("include", None)
        names = [includes] if isinstance(includes, str) else [] if includes is None else includes
        if not isinstance(names, list):
            raise ConfigFileError(
                _where(path, node, ("include",)),
                "include is neither a file name nor a list of them",
                "write include: [other.yaml]",
            )
        chain = (*chain, _resolved(path, str(path)))
        merged: dict[str, Any] = {}
        for i, name in enumerate(names):
            where = _where(path, node, ("include", i) if isinstance(includes, list) else ("include",))
            inc_data, _ = self.read(self._included(path, where, name, chain), chain)
            merged.update(inc_data)
        merged.update(data)
        return merged, node

    def _included(self, path: Path, where: str, name: object, chain: tuple[Path, ...]) -> Path:
        """The file ``name`` names, refused unless it is a relative path inside the project that
        is not already being read, within the load's file budget."""
        if not isinstance(name, str) or not name:
            raise ConfigFileError(
                where, f"include {name!r} is not a file name", "list file names relative to this file"
            )
        target = _resolved(chain[-1].parent / name, where)
        if not target.is_relative_to(self.root):
            raise ConfigFileError(
                where,
                f"include {name!r} is outside the project ({self.root})",
                "include only files inside the project, by a path relative to this file",
            )
        if target in chain:
            loop = " -> ".join(p.name for p in (*chain[chain.index(target) :], target))
            raise ConfigFileError(where, f"include loop ({loop})", "remove one of the includes")
        if self.files >= MAX_FILES:
            raise ConfigFileError(
                where,
                f"one config may read at most {MAX_FILES} files with its includes",
                "include fewer files",
            )
        return target


def _resolved(path: Path, where: str) -> Path:
    """``path`` with every symlink resolved; a name no file can have or a symlink loop is refused."""
    try:
        return path.resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # RuntimeError: a symlink loop (Python 3.11)
        raise ConfigFileError(
            where, f"cannot resolve {str(path)!r} ({exc})", "point at a YAML file"
        ) from None


def _where(path: Path, root: yaml.Node | None, loc: tuple[Any, ...]) -> str:
    """``file:line`` of the value at ``loc``, or the file when the line is unknown."""
    node = _node_for(root, loc)
    return f"{path}:{node.start_mark.line + 1}" if node is not None else str(path)


def load_model(path: str | Path, model: type[M], **context: Any) -> M:
    """Read ``path`` and validate it as ``model``; errors name the line and a fix."""
    path = Path(path)
    data, root = read_yaml(path)
    try:
        return model.model_validate(data, context=context or None)
    except ValidationError as exc:
        raise _explain(path, root, model, exc) from None


def _explain(
    path: Path, root: yaml.Node | None, model: type[BaseModel], exc: ValidationError
) -> ConfigFileError:
    problems = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        node = _key_node(root, loc) if err["type"] == "extra_forbidden" else _node_for(root, loc)
        line = f":{node.start_mark.line + 1}" if node is not None and loc else ""
        dotted = ".".join(str(p) for p in loc) or "(top level)"
        message = err["msg"]
        if err["type"] == "extra_forbidden":
            suggestion = nearest(str(loc[-1]), _allowed_keys(model, loc))
            message = f"unknown key '{loc[-1]}'" + (f" (did you mean '{suggestion}'?)" if suggestion else "")
        problems.append(f"{path}{line}: {dotted}: {message}")
    first_where, _, first_problem = problems[0].partition(": ")
    problem = first_problem + (
        f" (and {len(problems) - 1} more: " + "; ".join(problems[1:]) + ")" if len(problems) > 1 else ""
    )
    return ConfigFileError(first_where, problem, "correct the value in that file")


def project_of(start: Path) -> Path | None:
    """The nearest directory from ``start`` up that is a project (gates.yaml and targets/), or None."""
    for candidate in (start, *start.parents):
        if (candidate / "gates.yaml").exists() and (candidate / "targets").is_dir():
            return candidate
    return None
