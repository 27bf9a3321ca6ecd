"""What a suite kind's runner is (``SuiteKind``), what it is given (``EvalContext``) and what it
returns (``SuiteResult``). The kinds import this module; the registry that finds them
(``loaded``) imports the kinds.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantgate.declarations import SuiteDeclaration
from quantgate.declarations.metrics import item_errors
from quantgate.evaluate.data import DataDir
from quantgate.runtime.progress import SILENT, Progress
from quantgate.runtime.registry import mark

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


class SuiteKind(SuiteDeclaration):
    """Base of every suite kind's runner: the kind's declaration (``quantgate.declarations``:
    spec model, metrics, tenant, items) and what evaluates it.

    Subclasses derive from their kind's declaration too and implement ``reference`` and
    ``score`` (what ``quantgate eval`` runs). Keep torch and
    other heavy imports inside the methods that run models, so the gate stays light. An item that
    could not be evaluated is recorded with ``"error": "<reason>"`` (``metrics.ERROR``), never
    as a wrong answer; ``item_error`` reads it.
    """

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

    def inputs(self) -> list[str]:
        """Digests of what this suite reads besides its YAML and pinned data sets (a file of items
        beside it, the traffic it samples): the suite's identity, and so the reference cache key,
        covers them (``load_suite``). The default reads nothing else."""
        return []

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


register = mark  # @register("kind"): the kind's runner, found by ``loaded.KINDS``
