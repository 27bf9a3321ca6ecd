"""Evaluation suites: one YAML each under ``eval_suites/``, one module per suite kind.

A suite YAML names its ``kind``; the kind (a ``SuiteKind``) validates the YAML strictly, runs
the source once and scores models against it, and declares what the gate may measure on it
(``quantgate.metrics``), so that neither the evaluation runner nor the gate has code per kind. A
new kind is one file with ``@register("kind")``, or, from outside this package, a
``quantgate.suite_kinds`` entry point (``name = module:Class``) of an installed distribution; a
new suite of an existing kind (a tenant's domain suite) is a YAML and its data, no code.

Reading suite YAMLs (``SuiteSpec``, ``load_suites``) is configuration (``quantgate.config.suites``)
and the kinds' registry sits below it (``quantgate.extensions.SUITE_KINDS``), so that gates.yaml is
validated against the suites without configuration importing evaluation; both are re-exported
here for the kinds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from quantgate.config import PROFILES, LoadedSuite, SuiteSpec, load_suite, load_suites, suite_names
from quantgate.evaluate.data import DataDir
from quantgate.extensions import SUITE_KIND_ENTRY_POINTS, SUITE_KINDS
from quantgate.metrics import Metric, item_error, item_errors
from quantgate.progress import SILENT, Progress

# a token generated one at a time costs about this many tokens prefilled in one pass (greedy decoding
# of the default model on 2 CPU cores: 26-195 tokens/s generated against ~1,500 scored)
DECODE = 16.0


@dataclass
class EvalContext:
    """Everything a suite needs besides the model: passed in, never global."""

    profile: str
    data: DataDir
    project_root: Path
    cache_dir: Path
    progress: Progress = SILENT
    # score the source a second time on suites that count lost answers, so that the gate compares an
    # artifact's losses with the source's own (``metrics.RERUN``); None: where the device is not
    # bit-reproducible (any but the CPU, whose greedy decoding is)
    rerun_source: bool | None = None


@dataclass
class SuiteResult:
    """One model's result on one suite: metrics, per-sample records, and what they mean.

    ``errors``: how many items could not be evaluated, by reason (``metrics.item_errors`` of
    the samples, filled in when not given, and said in ``notes``); empty when every item was.
    Such items carry ``"error"`` in their record and count in no metric. ``sampling``: how the
    items were drawn from their population (``results.SampleDesign``), for the gate.
    """

    suite: str
    kind: str
    metrics: dict[str, float | None]
    samples: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    # how the items were drawn (``results.SampleDesign`` as a dict): what the gate's confidence covers
    sampling: dict[str, Any] | None = None

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

    def inputs(self) -> list[str]:
        """Digests of what this suite reads besides its YAML and pinned data sets (a file of items
        beside it, the traffic it samples): the suite's identity, and so the reference cache key,
        covers them (``config.suites.load_suite``). The default reads nothing else."""
        return []

    def cost(self, profile: str) -> float:
        """What scoring one model on this suite costs at ``profile``, in prefilled-token equivalents
        (a generated token counts ``DECODE`` of them): evaluation runs an artifact's suites cheapest
        first, so that the ones an already failed artifact skips are the expensive ones
        (``quantgate.evaluate.skip``). The default counts every kind the same."""
        return 1.0

    def items(self, profile: str) -> int:
        """How many items (windows, traces, questions) this suite evaluates at ``profile``: what a
        floor's evidence rests on (gates.yaml refuses an advisory floor no such count lets fail)."""
        return int(getattr(self.spec.sizes(profile), "items"))  # noqa: B009 (each kind's sizes model)

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


KINDS = SUITE_KINDS
ENTRY_POINTS = SUITE_KIND_ENTRY_POINTS
register = KINDS.register

__all__ = [
    "DECODE",
    "ENTRY_POINTS",
    "KINDS",
    "PROFILES",
    "EvalContext",
    "LoadedSuite",
    "SuiteKind",
    "SuiteResult",
    "SuiteSpec",
    "load_suite",
    "load_suites",
    "register",
    "suite_names",
]
