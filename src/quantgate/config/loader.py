"""Load YAML config files into validated, immutable pydantic models.

Why not plain ``model_validate(yaml.safe_load(...))``: a pydantic error says *which field*,
not *which line of which file*, and a typo like ``kv_cahe`` deserves "did you mean
``kv_cache``?". This loader keeps the YAML node tree so that every validation error reads
``file:line: problem (did you mean ...)``. A top-level ``include: [other.yaml]`` merges those
files first (relative to the including file, whose own keys win). Safe loader only: no code
runs from config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from quantgate.errors import ConfigFileError
from quantgate.suggest import nearest

M = TypeVar("M", bound=BaseModel)


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
    """Parse one YAML file (with includes) into data and its node tree."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigFileError(path, "file not found", "check the path, or create the file") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigFileError(
            where, f"not valid YAML ({getattr(exc, 'problem', exc)})", "fix the syntax"
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigFileError(
            path, "expected a mapping at the top level", "write the file as key: value pairs"
        )
    includes = data.pop("include", [])
    if isinstance(includes, str):
        includes = [includes]
    merged: dict[str, Any] = {}
    for inc in includes:
        inc_data, _ = read_yaml((path.parent / inc).resolve())
        merged.update(inc_data)
    merged.update(data)
    return merged, node


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
