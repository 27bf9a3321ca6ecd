"""report.json: the gate's decision as one typed, versioned contract.

The gate writes it; the reports (Markdown, HTML, the console table) render it; publish reads
the approvals, verdicts and metrics from it. One model for all of them, so a field is renamed
in one place and a report a reader cannot understand is refused at the file, not deep inside
a renderer. Fields that only the gate's own output carries (floors, numerics, sizes, serving, notes)
have defaults, so a report reduced to the decision (model, approvals, exit code) still reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, PrivateAttr, ValidationError, model_validator, with_config
from typing_extensions import TypedDict

from quantgate.contracts.serving_table import ServingTable
from quantgate.runtime import bounded_json
from quantgate.runtime.errors import ReportError
from quantgate.runtime.frozen import FrozenRecord

SCHEMA_VERSION = 3
REPORT_JSON = "report.json"
# beside report.json: records/<artifact>.json, each artifact's per-item results, named by sha256 in the
# report's ``records`` and published with its version (what a later regression is paired with)
BASELINES_DIR = "baselines"  # beside report.json: <artifact>/<tenant>/ a copy of a baseline not superseded
RECORDS_DIR = "records"
# A report of four targets, six tenants and the full profile's per-item sequential estimates is
# under 2 MB; a report.json (one from the registry included) is read within these bounds (size
# before a byte is read, nesting depth and integer length while parsing): a report nested
# 100,000 deep crashed ``quantgate gate`` with a RecursionError.
MAX_REPORT_BYTES = 64 * 1000 * 1000

# pass / fail: decided with evidence. violation: an advisory floor whose estimate is beyond it, on
# items that cannot establish it (shown, does not fail the verdict; a required floor fails instead).
# missing: no data (fails). error: items that could not be evaluated (fails). not_run: evaluation
# skipped the suite because every tenant had already failed (fails, as missing data would).
# insufficient_evidence: an artifact equal to the source would not pass on these items (fails
# unless the floor is advisory). no_baseline: a max_regression floor with no approved version to
# compare with (first release; never fails). uninformative: schema 1 only.
Status = Literal[
    "pass",
    "fail",
    "violation",
    "missing",
    "error",
    "not_run",
    "insufficient_evidence",
    "no_baseline",
    "uninformative",
]
STATUS_TEXT = {
    "insufficient_evidence": "insufficient evidence",
    "no_baseline": "no approved version",
    "not_run": "not run",
}
Metrics = dict[str, dict[str, dict[str, float | None]]]  # "source" | artifact -> suite -> metric -> value


# Open records whose keys the renderers read are typed (a wrongly typed one is refused at the file,
# naming the field, instead of a TypeError inside a renderer); other keys are kept as written.
@with_config(ConfigDict(extra="allow"))
class EvaluatedNumerics(TypedDict, total=False):
    """How one model was evaluated (``numerics.load.NumericsReport``; the gate writes ``mode: unknown``
    where it has none)."""

    mode: str
    device: str
    tensor_parallel: int
    weights: str
    activations: str
    kv_cache: str
    native_on: list[str]
    notes: list[str]


@with_config(ConfigDict(extra="allow"))
class SequentialDesign(TypedDict, total=False):
    """One suite's sequential evaluation (``evaluate.sequential``): items used, why it stopped, seconds."""

    items_used: int
    items_total: int
    stopped: str
    seconds: float
    seconds_saved_estimate: float


class FloorResult(FrozenRecord):
    """One floor judged for one artifact: estimate, the conservative bound compared, its power, and why.

    ``mde`` (minimum detectable effect) and ``tolerance`` are in the floor's units: the smallest
    departure from ``no_change`` (the value with the artifact equal to the source) that these
    items show at the tenant's confidence, and the departure the floor allows; a floor whose
    ``mde`` exceeds its ``tolerance`` cannot tell an artifact at the floor from the source.
    ``before`` / ``delta``: the same quantity in the version the registry approves for the tenant
    today, and this estimate minus it.
    """

    suite: str
    metric: str
    kind_of_floor: str  # max | min | max_delta_pct | min_recovery | max_regression
    floor: float
    estimate: float | None
    bound: float | None  # the conservative end that was compared; never a bare point estimate
    margin: float | None  # >= 0 when the bound is on the right side of the floor
    passed: bool | None  # None: neither pass nor fail (insufficient evidence, no approved version)
    informative: bool  # decided with evidence (pass or fail)
    status: Status
    # exact (Clopper-Pearson, quantgate.stats.bounds) or betting (a bounded mean within its stated
    # class, stats.betting); confidence-sequence: decided early by sequential evaluation (the betting
    # test looked at after every batch, stats/sequence.py). Older reports: bootstrap-t (calibrated),
    # exceedance-inversion (a pooled quantile), paired-bootstrap (percentile, schema 2), point (schema 1)
    interval: (
        Literal[
            "exact",
            "betting",
            "bootstrap-t",
            "exceedance-inversion",
            "confidence-sequence",
            "paired-bootstrap",
            "point",
        ]
        | None
    )
    confidence: float
    items: int
    reason: str
    mde: float | None = None
    tolerance: float | None = None
    no_change: float | None = None
    advisory: bool = False
    before: float | None = None
    delta: float | None = None
    evidence: str | None = None  # insufficient evidence: why, in a few words
    spread: float | None = None  # the bound's measured machine-to-machine spread (gates.yaml numerics_spread)
    marginal: bool = (
        False  # decided, but within ``spread`` of the floor: another machine may decide otherwise
    )
    other: float | None = None  # the interval's other end: beyond the floor, it establishes a violation
    method: str | None = None  # how the bound was computed, in words
    powered: bool | None = None  # an artifact equal to the source (or approved version) would pass here
    paired_with: str | None = None  # a regression: what it was compared with, item by item or by value
    # which end ``bound`` is: "upper" (a lower-is-better quantity's) or "lower"; None where none was compared
    end: Literal["upper", "lower"] | None = None
    coverage: str | None = None  # what the confidence covers: the population drawn and the class assumed


class BaselineRef(FrozenRecord):
    """The version the registry approves for one (target, tenant) today, that the gate compared with."""

    registered_model: str | None = None
    version: str | None = None
    origin: str  # "registry <tracking URI>", or the report.json given with --previous
    profile: str | None = None
    source_hash: str | None = None


class Verdict(FrozenRecord):
    """One artifact against one tenant: pass only if every applicable floor allows it."""

    artifact: str
    tenant: str
    verdict: Literal["pass", "fail"]
    reasons: list[str]
    floors: list[FloorResult] = []
    required: bool = False
    baseline: BaselineRef | None = None  # what before/delta compare with; None: no approved version
    # another machine may decide it otherwise: a pass resting on a floor within the spread, or a
    # fail whose every failing floor is within it
    marginal: bool = False


class PreviousReport(FrozenRecord):
    """What a schema-1 report compared against (``--previous``); schema 2 keeps baselines per verdict."""

    model: str | None = None
    source_hash: str | None = None
    approvals: dict[str, list[str]] = {}
    metrics: Metrics = {}
    report: str | None = None  # path of that report.json


# ---------------------------------------------------------------- repair (quantgate.repair)


class ProbeRecord(FrozenRecord):
    """One variant tried, as repair.json and the report show it."""

    k: int
    bytes: int
    passed: list[str]
    quality: dict[str, float]  # "<suite>.<metric>" estimates of the repaired tenants' floors
    seconds: float
    path: str


class TenantRepair(FrozenRecord):
    """One (target, tenant): the smallest passing k (None: none within the budget) and why it stopped."""

    tenant: str
    k: int | None
    stopped: str
    variant: str | None = None  # the chosen variant's directory


class TargetRepair(FrozenRecord):
    """Everything one target's search did."""

    target: str
    upgrade: str
    units: int
    uniform_bytes: int
    parent_build_key: str
    sensitivity_seconds: float
    sensitivity_cached: bool
    kld_uniform: float
    ranked: list[str]  # layer groups, most sensitive first
    budget: int
    probes: list[ProbeRecord]
    tenants: list[TenantRepair]
    seconds: float

    @property
    def builds(self) -> int:
        """Variants built (each also evaluated and gated once)."""
        return len(self.probes)

    @model_validator(mode="after")
    def _chosen_were_tried(self) -> TargetRepair:
        """Each tenant's chosen k is a variant the search built (the report quotes its bytes)."""
        tried = {p.k for p in self.probes}
        for t in self.tenants:
            if t.k is not None and t.k not in tried:
                raise ValueError(f"tenant {t.tenant!r} chose k={t.k}, which no probe tried ({sorted(tried)})")
        return self


class Report(FrozenRecord):
    """report.json, schema version 3 (versions 1 and 2 still read: 2 without per-item records and
    calibrated bounds, 1 also without power, errors and baselines)."""

    schema_version: Literal[1, 2, 3] = 3  # SCHEMA_VERSION
    model: str
    model_class: str | None = None
    source_hash: str | None = None
    profile: str | None = None
    required: list[str] = []
    optional: list[str] = []
    verdicts: list[Verdict] = []
    approvals: dict[str, list[str]]  # artifact -> tenants it passed
    numerics: dict[str, EvaluatedNumerics] = {}  # artifact -> how it was evaluated (native or emulated)
    exit_code: int
    notes: list[str] = []
    sizes: dict[str, int | None] = {}  # "source" | artifact -> bytes on disk (cold-start cost)
    # artifact -> its manifest's serving check (engine, releases, TP sizes)
    serving: dict[str, ServingTable] = {}
    metrics: Metrics = {}
    suite_notes: dict[str, list[str]] = {}  # suite -> notes (e.g. long-chain bin width)
    previous: PreviousReport | None = None  # schema 1 only
    # suite -> why it carried no evidence on this model (every floor on it, in every verdict, lacked power)
    no_evidence: dict[str, list[str]] = {}
    baselines_from: str | None = None  # where approved versions were looked up; None: nowhere
    baseline_notes: list[str] = []
    # quantgate repair: each repaired target's search (variants tried, bytes, why it stopped)
    repairs: list[TargetRepair] = []
    # quantgate eval --sequential: artifact -> suite -> items used and in all, why it stopped, seconds
    # taken and the estimate for every item (evaluate/sequential.py); empty: the fixed design
    sequential: dict[str, dict[str, SequentialDesign]] = {}
    # artifact -> sha256 of its per-item records (records/<artifact>.json beside report.json, published
    # with its version): what a later release's regression floors are paired with
    records: dict[str, str] = {}
    # artifact -> suite -> why evaluation did not run it (no floor could change a verdict: every floor
    # lacked power, or every tenant had already failed on suites run before it)
    skipped: dict[str, dict[str, str]] = {}
    # in memory only, not in report.json: the baselines this decision compared with (a
    # ``gate.baseline.Baselines``), so that ``write_report_json`` keeps beside it a copy of each one a
    # tenant was not approved against (``baselines/``): a later ``--previous`` of this report then
    # compares that tenant with what this one did, as the registry would
    _compared: Any = PrivateAttr(None)

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
    """Read and validate a report.json within ``bounded_json``'s bounds (at most
    ``MAX_REPORT_BYTES``); a missing, oversized, too deeply nested, unparsable or malformed one is
    a ReportError (exit 2, one line)."""
    path = Path(path)
    try:
        data = bounded_json.parse(bounded_json.read_bytes(path, MAX_REPORT_BYTES))
    except OSError as exc:
        raise ReportError(path, f"not a readable gate report ({exc.strerror or exc})", fix) from None
    except bounded_json.JsonRefused as exc:
        raise ReportError(path, f"not a readable gate report ({exc.problem})", fix) from None
    except ValueError as exc:  # malformed JSON, or not UTF-8
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise ReportError(path, f"not a readable gate report (not JSON: {first})", fix) from None
    if not isinstance(data, dict):
        raise ReportError(path, "not a readable gate report (not a JSON object)", fix)
    try:
        return Report.model_validate(data)
    except ValidationError as exc:
        raise ReportError(path, f"not a readable gate report ({_problem(exc)})", fix) from None
