"""What configuration knows of a suite kind, below configuration and every stage.

A suite YAML names its ``kind``. The kind's declaration (a ``SuiteDeclaration``, one module per
kind under ``quantgate.declarations.suite_kinds``, decorated ``@declare("kind")``) brings the strict
model the YAML is validated with, the metrics a floor may name on it, its tenant, how many
items a profile evaluates and how one scored record reads as numbers: all that gates.yaml is
checked against and the gate reads. What evaluates a suite (the
kind's runner, ``quantgate.evaluate.suites``) derives from the declaration and is looked up by the
evaluation stage, never by configuration. A plugin's kind (a ``quantgate.suite_kinds`` entry point)
is one class that is both.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from quantgate.declarations.metrics import Metric, item_error
from quantgate.runtime.errors import UsageError
from quantgate.runtime.frozen import Frozen
from quantgate.runtime.registry import mark

PROFILES = ("smoke", "full")


class DataSource(Frozen):
    """Where one data file comes from: a path in the data directory and its hub equivalent."""

    local: str = Field(description="path relative to the data directory")
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    hub: dict[str, str] | None = Field(None, description="datasets.load_dataset args: path, name, split")


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


class SuiteDeclaration(ABC):
    """Base of every suite kind's declaration: holds the validated spec and the YAML's path.

    Subclasses set ``spec_model`` and implement ``metrics`` and ``columns``; ``tenant``,
    ``items`` and ``item_error`` have defaults. Nothing here runs a model: configuration builds
    one per suite YAML, and the gate reads scored records through it.
    """

    spec_model: ClassVar[type[SuiteSpec]]

    def __init__(self, spec: SuiteSpec, path: Path) -> None:
        self.spec, self.path = spec, path

    @property
    def tenant(self) -> str | None:
        """The tenant this suite belongs to (only its floors may name it); None: any tenant's."""
        return None

    @abstractmethod
    def metrics(self) -> dict[str, Metric]:
        """Every metric a gate floor may name on this suite, as this suite's spec configures it."""

    def items(self, profile: str) -> int:
        """How many items (windows, traces, questions) this suite evaluates at ``profile``: what a
        floor's evidence rests on (gates.yaml refuses an advisory floor no such count lets fail)."""
        return int(getattr(self.spec.sizes(profile), "items"))  # noqa: B009 (each kind's sizes model)

    def item_error(self, sample: Mapping[str, Any]) -> str | None:
        """Why this per-item record could not be evaluated (its ``"error"``), or None when it was.

        The gate asks this before ``columns``: a suite with any such item gives no evidence on
        them, so its floors are ``error``, never pass or fail.
        """
        return item_error(sample)

    @abstractmethod
    def columns(self, sample: Mapping[str, Any]) -> Mapping[str, float | list[float]]:
        """One per-item record (an entry of a suite result's ``samples``) as numeric columns for
        the metrics' statistics (a list of numbers where a statistic pools values across items,
        e.g. a quantile); KeyError when a field is absent, ``metrics.ItemError`` (a KeyError) for a
        record that could not be evaluated."""


declare = mark  # @declare("kind"): the kind's declaration, found by ``declarations.SUITE_KINDS``
