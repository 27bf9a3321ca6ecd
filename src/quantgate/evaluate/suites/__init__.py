"""Evaluation suites: one YAML each under ``eval_suites/``, one module per suite kind.

A suite YAML names its ``kind``; the kind (a ``SuiteKind``) validates the YAML strictly, runs
the source once and scores models against it, and declares what the gate may measure on it, so
that neither the evaluation runner nor the gate has code per kind. A new kind is one file with
``@register("kind")``, or, from outside this package, a ``quantgate.suite_kinds`` entry point
(``name = module:Class``) of an installed distribution; a new suite of an existing kind (a
tenant's domain suite) is a YAML and its data, no code.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, ClassVar

import yaml
from pydantic import Field

from quantgate.config.loader import load_model, read_yaml
from quantgate.config.targets import Frozen
from quantgate.errors import ConfigFileError, UsageError
from quantgate.evaluate.data import DataDir
from quantgate.evaluate.suites.metrics import Metric, item_error, item_errors
from quantgate.progress import SILENT, Progress
from quantgate.registry import Registry
from quantgate.suggest import did_you_mean

PROFILES = ("smoke", "full")
# a token generated one at a time costs about this many tokens prefilled in one pass (greedy decoding
# of the default model on 2 CPU cores: 26-195 tokens/s generated against ~1,500 scored; DESIGN.md)
DECODE = 16.0


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


@dataclass
class EvalContext:
    """Everything a suite needs besides the model: passed in, never global."""

    profile: str
    data: DataDir
    project_root: Path
    cache_dir: Path
    progress: Progress = SILENT


@dataclass
class SuiteResult:
    """One model's result on one suite: metrics, per-sample records, and what they mean.

    ``errors``: how many items could not be evaluated, by reason (``metrics.item_errors`` of
    the samples, filled in when not given, and said in ``notes``); empty when every item was.
    Such items carry ``"error"`` in their record and count in no metric.
    """

    suite: str
    kind: str
    metrics: dict[str, float | None]
    samples: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.errors:
            self.errors = item_errors(self.samples)
        if self.errors:
            reasons = "; ".join(f"{n} × {reason}" for reason, n in self.errors.items())
            note = (
                f"{sum(self.errors.values())} of {len(self.samples)} items could not be evaluated "
                f"and count in no metric: {reasons}"
            )
            if note not in self.notes:
                self.notes.append(note)


class SuiteKind(ABC):
    """Base of every suite kind: holds the validated spec and the YAML's path.

    Subclasses set ``spec_model`` and implement ``reference`` and ``score`` (what ``quantgate
    eval`` runs) and ``metrics`` and ``columns`` (what the gate reads). Keep torch and other
    heavy imports inside the methods that run models, so the gate stays light. An item that
    could not be evaluated is recorded with ``"error": "<reason>"`` (``metrics.ERROR``), never
    as a wrong answer; ``item_error`` reads it.
    """

    spec_model: ClassVar[type[SuiteSpec]]

    def __init__(self, spec: SuiteSpec, path: Path) -> None:
        self.spec, self.path = spec, path

    @property
    def tenant(self) -> str | None:
        """The tenant this suite belongs to (only its floors may name it); None: any tenant's."""
        return None

    @abstractmethod
    def reference(self, ctx: EvalContext, source: Any) -> tuple[Any, SuiteResult]:
        """Run the source once; return what scoring needs and the source's own result.

        What scoring needs: top-k next-token distributions, greedy traces, per-item correctness.
        The evaluation runner caches it (``quantgate.evaluate.runner.reference_path``), so
        artifacts are scored without running the source again.
        """

    @abstractmethod
    def score(self, ctx: EvalContext, model: Any, reference: Any) -> SuiteResult:
        """Score one model against the reference, paired item by item."""

    @abstractmethod
    def metrics(self) -> dict[str, Metric]:
        """Every metric a gate floor may name on this suite, as this suite's spec configures it."""

    def cost(self, profile: str) -> float:
        """What scoring one model on this suite costs at ``profile``, in prefilled-token equivalents
        (a generated token counts ``DECODE`` of them): evaluation runs an artifact's suites cheapest
        first, so that the ones an already failed artifact skips are the expensive ones
        (``quantgate.evaluate.skip``). The default counts every kind the same."""
        return 1.0

    def subset(self, reference: Any, positions: list[int]) -> Any | None:
        """The reference restricted to the items at ``positions`` (in that order), whose scored
        records keep their items' own ids: what sequential evaluation scores batch by batch
        (``quantgate.evaluate.sequential``). None (the default): this kind scores all its items
        at once, and runs the fixed design."""
        return None

    def item_error(self, sample: Mapping[str, Any]) -> str | None:
        """Why this per-item record could not be evaluated (its ``"error"``), or None when it was.

        The gate asks this before ``columns``: a suite with any such item gives no evidence on
        them, so its floors are ``error``, never pass or fail.
        """
        return item_error(sample)

    @abstractmethod
    def columns(self, sample: Mapping[str, Any]) -> Mapping[str, float | list[float]]:
        """One per-item record (an entry of ``SuiteResult.samples``) as numeric columns for the
        metrics' statistics (a list of numbers where a statistic pools values across items, e.g.
        a quantile); KeyError when a field is absent, ``metrics.ItemError`` (a KeyError) for a record
        that could not be evaluated."""


ENTRY_POINTS = "quantgate.suite_kinds"


class KindRegistry(Registry[type[SuiteKind]]):
    """The suite kinds: this package's own (lazy modules), then installed ``quantgate.suite_kinds``
    entry points, looked up when a name is not found (so a plugin installed, or put on sys.path,
    after quantgate was imported is still found). A built-in name always wins."""

    @staticmethod
    def _plugins() -> dict[str, EntryPoint]:
        return {ep.name: ep for ep in entry_points(group=ENTRY_POINTS)}

    def names(self) -> list[str]:
        """Built-in kinds and installed entry points, sorted."""
        return sorted({*super().names(), *self._plugins()})

    def get(self, name: str, where: object = None) -> type[SuiteKind]:
        """The kind ``name``: built in, else loaded from its entry point; else a ConfigFileError."""
        if name not in super().names():
            plugin = self._plugins().get(name)
            if plugin is not None:
                self.add(name, plugin.load())
        return super().get(name, where)


KINDS = KindRegistry(
    "suite kind",
    lazy={
        "text": "quantgate.evaluate.suites.text",
        "long_chain": "quantgate.evaluate.suites.long_chain",
        "gsm8k": "quantgate.evaluate.suites.gsm8k",
        "humaneval": "quantgate.evaluate.suites.humaneval",
        "domain": "quantgate.evaluate.suites.domain",
    },
    how_to_add=f"@register in a module under quantgate/evaluate/suites, or a '{ENTRY_POINTS}' entry point",
)
register = KINDS.register


@dataclass(frozen=True)
class LoadedSuite:
    """One suite YAML, validated by its kind's spec model, with the kind's runner for it."""

    spec: SuiteSpec
    path: Path
    runner: SuiteKind
    spec_hash: str  # sha256 of the validated spec: the reference cache key's suite part


def load_suite(path: Path) -> LoadedSuite:
    """Read one suite YAML, find its kind in the registry and validate it strictly."""
    data, _ = read_yaml(path)
    kind = data.get("kind")
    if not isinstance(kind, str):
        raise ConfigFileError(path, "no 'kind' given", f"add kind: one of {KINDS.names()}")
    cls = KINDS.get(kind, path)
    spec = load_model(path, cls.spec_model)
    if spec.name != path.stem:
        raise ConfigFileError(
            path, f"name '{spec.name}' differs from the file name", f"set name: {path.stem}"
        )
    canonical = yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=True)
    return LoadedSuite(spec, path, cls(spec, path), hashlib.sha256(canonical.encode()).hexdigest())


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
