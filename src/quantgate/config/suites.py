"""Evaluation suites as configuration: ``eval_suites/<name>.yaml``, each validated by its kind's
declaration.

A suite YAML names its ``kind``; the kind's declaration (found by name in
``quantgate.declarations.SUITE_KINDS``, its module imported on first use) brings the strict spec
model the YAML is validated with and what gates.yaml may name on it. Configuration imports no
stage: what evaluates a suite is the evaluation stage's to find (``quantgate.evaluate.load_suites``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from quantgate.config.loader import load_model, read_yaml
from quantgate.declarations import SUITE_KINDS, SuiteDeclaration, SuiteSpec
from quantgate.runtime.errors import ConfigFileError, UsageError
from quantgate.runtime.suggest import did_you_mean


@dataclass(frozen=True)
class DeclaredSuite:
    """One suite YAML, validated by its kind's spec model, with the kind's declaration for it."""

    spec: SuiteSpec
    path: Path
    declaration: SuiteDeclaration


def declare_suite(path: Path) -> DeclaredSuite:
    """Read one suite YAML, find its kind's declaration and validate it strictly."""
    data, _ = read_yaml(path)
    kind = data.get("kind")
    if not isinstance(kind, str):
        raise ConfigFileError(path, "no 'kind' given", f"add kind: one of {SUITE_KINDS.names()}")
    cls = SUITE_KINDS.get(kind, path)
    spec = load_model(path, cls.spec_model)
    if spec.name != path.stem:
        raise ConfigFileError(
            path, f"name '{spec.name}' differs from the file name", f"set name: {path.stem}"
        )
    return DeclaredSuite(spec, path, cls(spec, path))


def suite_names(directory: Path) -> list[str]:
    """The suites of a project: the YAML files of its ``eval_suites/``, by name."""
    return sorted(p.stem for p in directory.glob("*.yaml"))


def declare_suites(directory: Path, names: list[str] | None = None) -> list[DeclaredSuite]:
    """The named suites (every suite when ``names`` is None), each validated; a typo suggests the nearest."""
    known = suite_names(directory)
    for name in names or []:
        if name not in known:
            raise UsageError("--suites", f"unknown suite '{name}'", did_you_mean(name, known))
    return [declare_suite(directory / f"{name}.yaml") for name in (names or known)]
