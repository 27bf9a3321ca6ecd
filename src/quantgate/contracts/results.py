"""An evaluation's output as one typed, versioned contract: written by evaluate, read by the gate,
repair, the reports and bench.

    E/<model>/<suite>.json   SuiteResultFile: one model's result on one suite, per-item records
    E/summary.json           {model: {"<suite>.<metric>": value}}: for people and CI logs
    E/run.json               RunInfo: what ran, on which numerics, which design, what was not run

A run evaluates in parts (the source once, then each artifact, each in its own directory):
``EvaluationPart`` is one part as the flow hands it to the gate, which merges them.

Why a contract: these files were dicts read by string key in six modules, so a renamed field
broke a reader silently (run.json carried a ``design`` and a ``sequential`` that two readers
interpreted differently). Now ``read_evaluation`` validates every file once, strictly, and a file
a reader cannot understand is refused naming the file and the field (exit 2). Per-item records
stay the suite kind's own (``SuiteKind.columns`` reads them): the contract fixes the envelope.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from quantgate.runtime.atomic import write_json
from quantgate.runtime.errors import InputError, first_problem
from quantgate.runtime.frozen import FrozenRecord

RESULTS_VERSION = 1
RUN_JSON = "run.json"
SUMMARY_JSON = "summary.json"
SOURCE = "source"  # the model directory of the source's own results


class SequentialDesign(FrozenRecord):
    """How one suite of one artifact was evaluated sequentially (``evaluate.sequential``)."""

    design: Literal["sequential"] = "sequential"
    order_seed: str
    batch: int
    items_used: int
    items_total: int
    stopped: Literal["decided", "exhausted"]
    undecided: list[str] = []
    seconds: float
    seconds_all_estimate: float
    seconds_saved_estimate: float
    floors: int


class SampleDesign(FrozenRecord):
    """How a suite's items were drawn, so that the gate states what its confidence covers and bets
    as the draw allows (``quantgate.stats``): what an item is, the population they were drawn from
    at random without replacement (None: not enumerable, items taken as independent draws), the
    seed that drew them, and the heaviest weight an item can carry, per weight column (a window's
    scored tokens)."""

    unit: str = "items"
    population: int | None = Field(None, ge=1)
    seed: int | str | None = None
    weights: dict[str, float] = {}

    def weight(self, column: str | None) -> float | None:
        """The declared heaviest weight of ``column``; None when not declared."""
        return self.weights.get(column) if column else None


class SuiteResultFile(FrozenRecord):
    """``E/<model>/<suite>.json``: one model's result on one suite.

    ``samples``: the per-item records, as the suite kind writes and reads them; ``errors``: items
    that could not be evaluated, by reason; ``sequential``: the design block when the suite stopped
    early or ran out sequentially; ``skipped``: why evaluation did not run the suite (no samples).
    """

    version: Literal[1] = 1  # RESULTS_VERSION
    model: str = ""
    suite: str
    kind: str
    metrics: dict[str, float | None] = {}
    samples: list[dict[str, Any]] = []
    notes: list[str] = []
    errors: dict[str, int] = {}
    numerics: dict[str, Any] = {}
    profile: str | None = None
    source_hash: str | None = None
    target: str | None = None
    build_key: str | None = None
    sequential: SequentialDesign | None = None
    skipped: str | None = None
    sampling: SampleDesign | None = None  # None: records written before it was declared


class SuiteRef(FrozenRecord):
    """A suite as run.json names it: its kind and the sha256 of its validated spec."""

    kind: str
    spec_sha256: str


class ReferenceCache(FrozenRecord):
    """Which suites' source references came from the cache and which were computed."""

    hits: list[str] = []
    computed: list[str] = []


class RunInfo(FrozenRecord):
    """``E/run.json``: what one evaluation ran (or several, merged)."""

    version: Literal[1] = 1  # RESULTS_VERSION
    model: str | None = None
    model_class: str | None = None
    profile: str
    # where the models ran: "cpu" or "cuda" (--device); "cpu" for runs written before it was recorded
    device: Literal["cpu", "cuda"] = "cpu"
    source_hash: str
    bytes: dict[str, int | None] = {}
    suites: dict[str, SuiteRef] = {}
    numerics: dict[str, dict[str, Any]] = {}
    reference_cache: ReferenceCache = ReferenceCache()
    source_forward_passes: int = 0
    environment: dict[str, Any] = {}
    design: Literal["fixed", "sequential"] = "fixed"
    # artifact -> suite -> its sequential design; artifact -> suite -> why it was not run
    sequential: dict[str, dict[str, SequentialDesign]] = {}
    skipped: dict[str, dict[str, str]] = {}
    merged_from: list[str] = Field(default_factory=list, description="the parts a merge was made of")
    # where the time went, in wall-clock seconds (the device synchronized at each mark): model ->
    # phase ("verify", "load", "reference:<suite>" for the source, "<suite>" for an artifact); a
    # merge sums each phase over its parts (the source's time is spent once per part that loads it)
    seconds: dict[str, dict[str, float]] = {}
    # the processes one model was spread over (``sharding``: processes, backend, engine); None: one
    shards: dict[str, Any] | None = None
    # --max-memory: the bytes each model could keep on the device, its other layers offloaded
    # (each model's numerics say how many); None: every model wholly on the device
    max_memory: int | None = None


@dataclass(frozen=True)
class Evaluation:
    """An evaluation directory, read and validated: every model's suite results and run.json."""

    path: Path
    results: dict[str, dict[str, SuiteResultFile]]  # "source" | artifact -> suite -> result
    run: RunInfo | None  # None: a directory written without one (tests, hand-made)

    @property
    def artifacts(self) -> list[str]:
        """The evaluated artifacts (every model directory but the source's), in name order."""
        return [m for m in self.results if m != SOURCE]

    def result(self, model: str, suite: str) -> SuiteResultFile | None:
        """One model's result on one suite; None when it was not evaluated."""
        return self.results.get(model, {}).get(suite)

    def build_key(self, artifact: str) -> str | None:
        """The build key an artifact's evaluation recorded (None for one not evaluated)."""
        return next((r.build_key for r in self.results.get(artifact, {}).values() if r.build_key), None)


def read_suite_result(path: Path) -> SuiteResultFile:
    """One ``<model>/<suite>.json``, validated; ``InputError`` naming the file and the field."""
    try:
        return SuiteResultFile.model_validate_json(Path(path).read_bytes())
    except ValidationError as exc:
        raise InputError(path, f"not an evaluation result: {first_problem(exc)}", "evaluate again") from exc


def read_run_info(path: Path) -> RunInfo:
    """``run.json``, validated; ``InputError`` naming the file and the field."""
    try:
        return RunInfo.model_validate_json(Path(path).read_bytes())
    except ValidationError as exc:
        raise InputError(
            path, f"not an evaluation's run.json: {first_problem(exc)}", "evaluate again"
        ) from exc


def read_evaluation(eval_dir: Path) -> Evaluation:
    """Every ``<model>/<suite>.json`` and ``run.json`` of an evaluation directory, validated."""
    eval_dir = Path(eval_dir)
    if not (eval_dir / SOURCE).is_dir():
        raise InputError(
            eval_dir, "no source/ results here", "point at the output directory of quantgate eval"
        )
    results = {
        d.name: {p.stem: read_suite_result(p) for p in sorted(d.glob("*.json"))}
        for d in sorted(eval_dir.iterdir())
        if d.is_dir()
    }
    run_json = eval_dir / RUN_JSON
    return Evaluation(eval_dir, results, read_run_info(run_json) if run_json.exists() else None)


def write_suite_result(out: Path, result: SuiteResultFile) -> Path:
    """``out/<model>/<suite>.json``, written atomically."""
    path = Path(out) / result.model / f"{result.suite}.json"
    write_json(path, result.model_dump(mode="json", exclude_none=True))
    return path


def write_run_info(out: Path, run: RunInfo) -> Path:
    """``out/run.json``, written atomically."""
    path = Path(out) / RUN_JSON
    write_json(path, run.model_dump(mode="json"))
    return path


Summary = dict[str, dict[str, float | None]]  # summary.json: model -> "<suite>.<metric>" -> value


def read_summary(eval_dir: Path) -> Summary:
    """``summary.json``: model -> "<suite>.<metric>" -> value."""
    return json.loads((Path(eval_dir) / SUMMARY_JSON).read_text())


class EvaluationPart(FrozenRecord):
    """One evaluation step's output: the source's references or one artifact's results, in their
    own directory, with its summary; the gate merges the parts (``evaluate.merge_evaluations``)."""

    name: str  # SOURCE or the artifact's target
    dir: Path
    summary: Summary

    @property
    def suites(self) -> list[str]:
        """The suites this part has results of for its own model, in summary order."""
        return list(dict.fromkeys(key.split(".", 1)[0] for key in self.summary.get(self.name, {})))

    @classmethod
    def read(cls, name: str, eval_dir: Path) -> EvaluationPart:
        """The part ``name`` that an evaluation wrote in ``eval_dir``."""
        return cls(name=name, dir=Path(eval_dir), summary=read_summary(eval_dir))
