"""Evaluation suites as configuration: ``eval_suites/<name>.yaml``, each validated by its kind.

A suite YAML names its ``kind``; the kind (found by name in ``quantgate.extensions.SUITE_KINDS``,
its module imported on first use) brings the strict spec model the YAML is validated with and the
runner that evaluates it. Here so that gates.yaml can be checked against the project's suites
(``config.gates``) without configuration importing evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from quantgate.config.identity import content_digest
from quantgate.config.loader import load_model, read_yaml
from quantgate.errors import ConfigFileError, UsageError
from quantgate.extensions import SUITE_KINDS
from quantgate.frozen import Frozen
from quantgate.suggest import did_you_mean

if TYPE_CHECKING:
    from quantgate.evaluate import SuiteKind

PROFILES = ("smoke", "full")


class SuiteSpec(Frozen):
    """Fields every suite has; each kind adds its own, and its own per-profile sizes."""

    version: int = 1
    name: str
    kind: str
    description: str
    seed: int = 0
    metrics: list[str] = Field(description="the metric names this suite reports")

    def sizes(self, profile: str) -> Any:
        """This suite's sizes for ``profile``; an unknown profile is a UsageError."""
        profiles = getattr(self, "profiles")  # noqa: B009 (each kind declares its own sizes model)
        if profile not in profiles:
            raise UsageError(
                "--profile", f"suite '{self.name}' has no profile '{profile}'", f"use one of {list(profiles)}"
            )
        return profiles[profile]


@dataclass(frozen=True)
class LoadedSuite:
    """One suite YAML, validated by its kind's spec model, with the kind's runner for it."""

    spec: SuiteSpec
    path: Path
    runner: SuiteKind
    spec_hash: str  # sha256 of the validated spec and what it reads: the reference cache key's suite part


def load_suite(path: Path) -> LoadedSuite:
    """Read one suite YAML, find its kind in the registry and validate it strictly."""
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
    runner = cls(spec, path)
    return LoadedSuite(spec, path, runner, content_digest([spec, runner.inputs()]))


def suite_names(directory: Path) -> list[str]:
    """The suites of a project: the YAML files of its ``eval_suites/``, by name."""
    return sorted(p.stem for p in directory.glob("*.yaml"))


def load_suites(directory: Path, names: list[str] | None = None) -> list[LoadedSuite]:
    """The named suites (every suite when ``names`` is None), each validated; a typo suggests the nearest."""
    known = suite_names(directory)
    for name in names or []:
        if name not in known:
            raise UsageError("--suites", f"unknown suite '{name}'", did_you_mean(name, known))
    return [load_suite(directory / f"{name}.yaml") for name in (names or known)]
