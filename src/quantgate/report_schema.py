"""report.json: the gate's decision as one typed, versioned contract.

The gate writes it; the reports (Markdown, HTML, the console table) render it; publish reads
the approvals, verdicts and metrics from it. One model for all of them, so a field is renamed
in one place and a report a reader cannot understand is refused at the file, not deep inside
a renderer. Fields that only the gate's own output carries (floors, numerics, sizes, serving, notes)
have defaults, so a report reduced to the decision (model, approvals, exit code) still reads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from quantgate.errors import ReportError
from quantgate.serving.table import ServingTable

SCHEMA_VERSION = 1
REPORT_JSON = "report.json"

Status = Literal["pass", "fail", "missing", "uninformative"]
Metrics = dict[str, dict[str, dict[str, Any]]]  # "source" | artifact -> suite -> metric -> value


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FloorResult(_Frozen):
    """One floor judged for one artifact: estimate, the conservative bound compared, and why."""

    suite: str
    metric: str
    kind_of_floor: str  # max | min | max_delta_pct | min_recovery
    floor: float
    estimate: float | None
    bound: float | None  # the conservative end that was compared
    margin: float | None  # >= 0 when the bound is on the right side of the floor
    passed: bool | None  # None: uninformative
    informative: bool
    status: Status
    interval: Literal["paired-bootstrap", "point"] | None
    confidence: float
    items: int
    reason: str


class Verdict(_Frozen):
    """One artifact against one tenant: pass only if every applicable floor allows it."""

    artifact: str
    tenant: str
    verdict: Literal["pass", "fail"]
    reasons: list[str]
    floors: list[FloorResult] = []
    required: bool = False


class PreviousReport(_Frozen):
    """What a report compares against: the previous approved version's report, in part."""

    model: str | None = None
    source_hash: str | None = None
    approvals: dict[str, list[str]] = {}
    metrics: Metrics = {}
    report: str | None = None  # path of that report.json


class Report(_Frozen):
    """report.json, schema version 1."""

    schema_version: Literal[1] = 1  # SCHEMA_VERSION
    model: str
    model_class: str | None = None
    source_hash: str | None = None
    profile: str | None = None
    required: list[str] = []
    optional: list[str] = []
    verdicts: list[Verdict] = []
    approvals: dict[str, list[str]]  # artifact -> tenants it passed
    numerics: dict[str, dict[str, Any]] = {}  # artifact -> how it was evaluated (native or emulated)
    exit_code: int
    notes: list[str] = []
    sizes: dict[str, int | None] = {}  # "source" | artifact -> bytes on disk (cold-start cost)
    # artifact -> its manifest's serving check (engine, releases, TP sizes)
    serving: dict[str, ServingTable] = {}
    metrics: Metrics = {}
    suite_notes: dict[str, list[str]] = {}  # suite -> notes (e.g. long-chain bin width)
    previous: PreviousReport | None = None

    def role(self, artifact: str) -> str:
        """required, optional, or outside class (built with --targets beyond the class)."""
        if artifact in self.required:
            return "required"
        return "optional" if artifact in self.optional else "outside class"

    def failed_tenants(self, artifact: str) -> list[str]:
        """Tenants whose verdict on ``artifact`` is fail."""
        return [v.tenant for v in self.verdicts if v.artifact == artifact and v.verdict == "fail"]

    def payload(self) -> dict[str, Any]:
        """The JSON object written to report.json (floats as computed; NaN is refused when writing)."""
        return self.model_dump()


def as_report(report: Report | Mapping[str, Any]) -> Report:
    """A Report as given, or validated from its JSON object (e.g. one passed between flow tasks)."""
    return report if isinstance(report, Report) else Report.model_validate(report)


def _problem(exc: ValidationError, shown: int = 3) -> str:
    """The first few validation errors, each as ``field.path: what is wrong``."""
    problems = []
    for err in exc.errors()[:shown]:
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        problems.append(f"{where}: {'unknown key' if err['type'] == 'extra_forbidden' else err['msg']}")
    more = f"; and {exc.error_count() - shown} more" if exc.error_count() > shown else ""
    return "; ".join(problems) + more


def read_report(path: str | Path, fix: str = "pass the directory written by quantgate gate --out") -> Report:
    """Read and validate a report.json; a missing, unparsable or malformed one is a ReportError (exit 2)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ReportError(path, f"not a readable gate report ({exc.strerror or exc})", fix) from None
    except ValueError as exc:
        raise ReportError(path, f"not a readable gate report (not JSON: {exc})", fix) from None
    if not isinstance(data, dict):
        raise ReportError(path, "not a readable gate report (not a JSON object)", fix)
    try:
        return Report.model_validate(data)
    except ValidationError as exc:
        raise ReportError(path, f"not a readable gate report ({_problem(exc)})", fix) from None
