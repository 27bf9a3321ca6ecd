"""What the reports show, derived from a report.json (``quantgate.contracts.report_schema.Report``) and nothing else."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from quantgate.contracts.report_schema import STATUS_TEXT, EvaluatedNumerics, FloorResult, Report, Verdict

FAILED = ("fail", "missing", "error", "not_run")  # and insufficient evidence on a floor that is not advisory
_BIN = re.compile(r"^(kld|agreement)_bin(\d+)$")
# the metric that stands for a suite when its recovery (artifact / source) is shown
PRIMARY = ("accuracy", "pass_at_1", "acceptance_k4", "top1_agreement")


def status_text(status: str) -> str:
    """A floor status as a reader says it ("insufficient evidence", not "insufficient_evidence")."""
    return STATUS_TEXT.get(status, status)


def fmt(x: float | None, other: float | None = None, *, sign: bool = False) -> str:
    """6 significant digits, full precision where that would hide a difference from ``other``."""
    if x is None:
        return "—"
    if isinstance(x, float) and not math.isfinite(x):
        return "∞" if x > 0 else "-∞"
    s = f"{x:+.6g}" if sign else f"{x:.6g}"
    if other is not None and x != other and f"{x:.6g}" == f"{other:.6g}":
        s = ("+" if sign and x >= 0 else "") + repr(float(x))
    return s


@dataclass(frozen=True)
class View:
    """The report's facts in the order and grouping both formats show them."""

    report: Report

    @property
    def verdicts(self) -> list[Verdict]:
        """Every (artifact, tenant) verdict, in the gate's order."""
        return list(self.report.verdicts)

    @property
    def artifacts(self) -> list[str]:
        """Artifacts in verdict order, then any only the approvals name."""
        names = [v.artifact for v in self.verdicts] + list(self.report.approvals)
        return list(dict.fromkeys(names))

    @property
    def tenants(self) -> list[str]:
        """Tenants in verdict order."""
        return list(dict.fromkeys(v.tenant for v in self.verdicts))

    def cell(self, artifact: str, tenant: str) -> Verdict | None:
        """The verdict of one (artifact, tenant), if the gate gave one."""
        return next((v for v in self.verdicts if v.artifact == artifact and v.tenant == tenant), None)

    def role(self, artifact: str) -> str:
        """required, optional, or outside class."""
        return self.report.role(artifact)

    def approved(self, artifact: str) -> list[str]:
        """Tenants ``artifact`` is approved for (the report's approvals, else its passing verdicts)."""
        approvals = self.report.approvals
        if artifact in approvals:
            return list(approvals[artifact])
        return [v.tenant for v in self.verdicts if v.artifact == artifact and v.verdict == "pass"]

    def headline(self) -> str:
        """One sentence: the exit code and what it means, then who approved what."""
        arts = self.artifacts
        approved = [a for a in arts if self.approved(a)]
        passes = sum(v.verdict == "pass" for v in self.verdicts)
        code = self.report.exit_code
        status = {
            0: "PASS (exit 0): every required artifact passed at least one tenant",
            1: "FAIL (exit 1): a required artifact passed no tenant",
        }.get(code, f"exit {code}")
        per = "; ".join(
            f"{a} for {len(self.approved(a))} ({', '.join(self.approved(a))})"
            if self.approved(a)
            else f"{a} for none"
            for a in arts
        )
        return (
            f"{status}. {len(approved)} of {len(arts)} artifacts approved for at least one tenant, "
            f"{passes} of {len(self.verdicts)} verdicts pass: {per}."
        )

    def failed_floors(self, verdict: Verdict) -> list[FloorResult]:
        """Floors that fail a verdict: failed, no data, items not evaluated, or no evidence (not advisory)."""
        return [
            f
            for f in verdict.floors
            if f.status in FAILED or (f.status == "insufficient_evidence" and not f.advisory)
        ]

    def no_evidence(self) -> dict[str, list[str]]:
        """``{suite: [why, ...]}``: suites that carried no evidence on this model."""
        return dict(self.report.no_evidence)

    def skipped(self) -> list[tuple[str, str, str]]:
        """(artifact, suite, why) for every suite evaluation did not run on an artifact because it
        could not change a verdict (``quantgate.evaluate.skip``)."""
        return [(a, suite, why) for a, suites in self.report.skipped.items() for suite, why in suites.items()]

    def serving_deltas(self) -> list[tuple[str, str, str, FloorResult]]:
        """(artifact, tenant, approved version, floor) for every floor compared with the version the
        registry approves for that tenant today (``before`` known), and every regression floor."""
        rows = []
        for v in self.verdicts:
            if v.baseline is None:
                continue
            ref = v.baseline
            version = f"v{ref.version}" if ref.version else ref.origin
            for f in v.floors:
                if f.before is not None or f.kind_of_floor == "max_regression":
                    rows.append((v.artifact, v.tenant, version, f))
        return rows

    def other_reasons(self, verdict: Verdict) -> list[str]:
        """Reasons of a verdict that no failing floor carries (e.g. no floor passed with evidence)."""
        carried = {f.reason for f in verdict.floors}
        return [r for r in verdict.reasons if r not in carried]

    def numerics(self) -> dict[str, EvaluatedNumerics]:
        """``{model: how it was evaluated}`` (native or emulated, formats, device, notes)."""
        return dict(self.report.numerics)

    def sizes(self) -> dict[str, int | None] | None:
        """``{"source"|artifact: bytes}`` when report.json carries ``sizes``; None otherwise."""
        return dict(self.report.sizes) if self.report.sizes else None

    def serving(self) -> list[tuple[str, str, str, str]]:
        """(artifact, engine and releases on hardware, TP sizes that load, refused TP sizes with the
        first reason each) for every artifact whose manifest carried a serving check."""
        rows = []
        for artifact, table in self.report.serving.items():
            engine = f"{table.engine} ≥ {table.min_version} on {', '.join(table.hardware)}"
            loads = ", ".join(map(str, table.loadable_tp)) or "none"
            refused = []
            for tp, version, r in table.first_refusals():
                more = f" (+{r.layers - 1})" if r.layers > 1 else ""
                refused.append(f"TP {tp}: {r.rule} at {r.layer}{more}: {r.reason} ({table.engine} {version})")
            rows.append((artifact, engine, loads, "; ".join(refused) or "—"))
        return rows

    def coverage(self) -> list[tuple[str, str]]:
        """What each floor's confidence covers (the population drawn and the class assumed), once per
        (suite, metric, floor kind) and statement, in the order floors first appear."""
        seen: dict[tuple[str, str], None] = {}
        for v in self.verdicts:
            for f in v.floors:
                if f.coverage:
                    seen.setdefault((f"{f.suite} {f.metric} {f.kind_of_floor} {f.floor:g}", f.coverage), None)
        return list(seen)

    def sequential(self) -> list[tuple[str, str, str, str, str, str]]:
        """(artifact, suite, items used of all, why it stopped, seconds, seconds saved estimate) for
        every suite evaluated sequentially; empty for the fixed design. One table for both renderers."""
        rows = []
        for artifact, suites in self.report.sequential.items():
            for suite, d in suites.items():
                used = f"{d.get('items_used')} of {d.get('items_total')}"
                rows.append(
                    (
                        artifact,
                        suite,
                        used,
                        str(d.get("stopped")),
                        fmt(d.get("seconds")),
                        fmt(d.get("seconds_saved_estimate")),
                    )
                )
        return rows

    def metrics(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Every suite metric of every model, as the evaluation reported it."""
        return dict(self.report.metrics)

    def long_chain_bins(self, suite: str = "long-chain") -> dict[str, dict[str, list[float | None]]]:
        """``{model: {"kld": [...], "agreement": [...]}}`` by position bin (1 = shallowest); {} when absent."""
        out: dict[str, dict[str, list[float | None]]] = {}
        for model, suites in self.metrics().items():
            bins: dict[str, dict[int, float | None]] = {"kld": {}, "agreement": {}}
            for name, value in ((suites or {}).get(suite) or {}).items():
                m = _BIN.match(name)
                if m:
                    bins[m.group(1)][int(m.group(2))] = value
            if any(bins.values()):
                n = max(max(b, default=0) for b in bins.values())
                out[model] = {k: [b.get(i) for i in range(1, n + 1)] for k, b in bins.items()}
        return out

    def recovery(self) -> dict[str, dict[str, float]]:
        """``{"suite metric": {artifact: artifact/source}}``: min_recovery floor estimates, then
        the primary metric of every other suite from ``metrics`` (zero source bases left out)."""
        out: dict[str, dict[str, float]] = {}
        for v in self.verdicts:
            for f in v.floors:
                if f.kind_of_floor == "min_recovery" and f.estimate is not None:
                    out.setdefault(f"{f.suite} {f.metric}", {}).setdefault(v.artifact, f.estimate)
        metrics = self.metrics()
        source = metrics.get("source") or {}
        covered = {k.split(" ")[0] for k in out}
        for suite, values in source.items():
            metric = next((m for m in PRIMARY if (values or {}).get(m) is not None), None)
            if suite in covered or metric is None or not values[metric]:
                continue
            for art in self.artifacts:
                value = ((metrics.get(art) or {}).get(suite) or {}).get(metric)
                if value is not None:
                    out.setdefault(f"{suite} {metric}", {})[art] = value / values[metric]
        return out

    def previous_deltas(self) -> list[tuple[str, str, float, float, float]]:
        """(artifact, "suite.metric", before, after, after - before) against the previous approved
        version, for every artifact that version approved and every metric a floor names."""
        previous = self.report.previous
        if previous is None:
            return []
        before_all, now_all = previous.metrics, self.report.metrics
        approved = {a for a, tenants in previous.approvals.items() if tenants}
        keys = list(dict.fromkeys((f.suite, f.metric) for v in self.verdicts for f in v.floors))
        rows = []
        for artifact in self.artifacts:
            if artifact not in approved:
                continue
            for suite, metric in keys:
                before = ((before_all.get(artifact) or {}).get(suite) or {}).get(metric)
                after = ((now_all.get(artifact) or {}).get(suite) or {}).get(metric)
                if isinstance(before, (int, float)) and isinstance(after, (int, float)):
                    rows.append((artifact, f"{suite}.{metric}", before, after, after - before))
        return rows
