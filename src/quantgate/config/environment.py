"""Environment settings (``QUANTGATE_*``) read into validated config, one line per refusal.

A fleet node is configured by its environment, so an environment variable overrides a field
of a config model (``artifacts_registry/registry.yaml``'s, for instance). ``overridden``
validates the variable's text with that field's own type and bounds, the ones its YAML value
meets, so a value is refused the same way wherever it is set, and the error names the variable,
what is wrong and the fix (exit 2) instead of ending in a ``ValueError`` or ``OverflowError``
traceback (issue 25: ``QUANTGATE_PULL_CACHE_MAX_GB=inf``, ``QUANTGATE_TRANSFER_CONCURRENCY=abc``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from quantgate.runtime.errors import SettingError

M = TypeVar("M", bound=BaseModel)


def setting(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The variable's value, stripped; None when it is unset or blank (the default applies)."""
    value = (os.environ if environ is None else environ).get(name, "").strip()
    return value or None


def path_setting(name: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """The variable as a path with ``~`` expanded; None when unset or blank."""
    value = setting(name, environ)
    return None if value is None else expanded(value, name)


def expanded(text: str, name: str) -> Path:
    """``text`` as a path with ``~`` expanded; a ``~user`` with no home is refused, naming ``name``
    (a variable or an option), instead of a ``RuntimeError`` traceback."""
    try:
        return Path(text).expanduser()
    except RuntimeError as exc:  # "Could not determine home directory."
        raise SettingError(name, f"cannot expand {text!r} ({exc})", "write the path in full") from None


def overridden(model: M, fields: Mapping[str, tuple[str, ...]], environ: Mapping[str, str], source: str) -> M:
    """``model`` with each set variable of ``fields`` (name -> field path) in its field, validated
    by the model's own types; ``source`` names where the value otherwise comes from, for the fix."""
    for name, path in fields.items():
        value = setting(name, environ)
        if value is None:
            continue
        data = model.model_dump()
        _put(data, path, value)
        try:
            model = type(model).model_validate(data)
        except ValidationError as exc:
            problem = exc.errors()[0]["msg"]
            shown = value if len(value) <= 40 else value[:40] + "..."
            raise SettingError(
                name,
                f"{shown!r} is not a valid {'.'.join(path)} ({problem[0].lower() + problem[1:]})",
                f"set {name} to a valid value, or unset it to use {'.'.join(path)} from {source}",
            ) from None
    return model


def _put(data: dict[str, Any], path: tuple[str, ...], value: str) -> None:
    for key in path[:-1]:
        data = data[key]
    data[path[-1]] = value
