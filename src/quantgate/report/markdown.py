"""``render_markdown``: the gate report for CI summaries and PR comments (GitHub-flavoured).

Every name, reason and note goes through ``quantgate.runtime.escape.md`` (or ``md_code`` in a code span):
a report is rendered where people read it, so text from data must never become markup."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quantgate.contracts.report_schema import FloorResult, Report, as_report
from quantgate.report import repair_section
from quantgate.report.view import View, fmt, status_text
from quantgate.runtime.escape import md, md_code
from quantgate.runtime.units import format_bytes

MARK = {"pass": "✅ pass", "fail": "❌ fail"}


def _floor_line(f: FloorResult) -> str:
    head = f"- {md_code(f'{f.suite} {f.metric}')} ({md(f.kind_of_floor)}, {md(status_text(f.status))})"
    if f.status in ("missing", "error") or (f.bound is None and f.evidence):
        return f"{head}: {md(f.reason.split(': ', 1)[-1])}"
    end = f"{f.end} end" if f.end else "bound"
    line = (
        f"{head}: estimate {fmt(f.estimate)}, {end} {fmt(f.bound, f.floor)}, floor {fmt(f.floor, f.bound)}, "
        f"margin {fmt(f.margin, sign=True)}"
    )
    if f.interval == "confidence-sequence":
        line += f", always valid, decided early on {f.items} items"
    if f.mde is not None:
        line += f", an unchanged artifact's end {fmt(f.mde)} from no change (tolerance {fmt(f.tolerance)})"
    if f.marginal:
        line += f", ⚠ marginal (within the machine-to-machine spread {fmt(f.spread)})"
    return line + (f": {md(f.evidence)}" if f.evidence else "")


def render_markdown(report: Report | Mapping[str, Any]) -> str:
    """The report as GitHub-flavoured Markdown: headline, verdicts, failed floors, numerics, sizes,
    serving, and the deltas against the previous approved version."""
    report = as_report(report)
    view = View(report)
    tenants, out = view.tenants, []
    out.append(f"# quantgate gate report: {md(report.model)}")
    out.append("")
    out.append(f"**{md(view.headline())}**")
    out.append("")
    src = report.source_hash
    out.append(
        f"model class {md_code(report.model_class)} · profile {md_code(report.profile)} · "
        f"source {md_code(src[:12]) if src else '`unknown`'} · report schema {md(report.schema_version)}"
    )
    for note in report.notes:
        out.append(f"\n> {md(note)}")
    out += ["", "## Verdicts", ""]
    out.append("| artifact | role | numerics | " + " | ".join(md(t) for t in tenants) + " |")
    out.append("| --- | --- | --- |" + " --- |" * len(tenants))
    numerics = view.numerics()
    for a in view.artifacts:
        cells = [
            MARK.get(cell.verdict, "—") + (" ⚠ marginal" if cell.marginal else "")
            if (cell := view.cell(a, t))
            else "—"
            for t in tenants
        ]
        mode = (numerics.get(a) or {}).get("mode", "unknown")
        out.append(f"| {md(a)} | {view.role(a)} | {md(mode)} | " + " | ".join(cells) + " |")
    failing = [v for v in view.verdicts if v.verdict != "pass"]
    if failing:
        out += ["", "## Failed floors", ""]
        for i, v in enumerate(failing):
            out += [""] if i else []
            out.append(f"### ❌ {md(v.artifact)} × {md(v.tenant)} ({view.role(v.artifact)})")
            out.append("")
            out += [_floor_line(f) for f in view.failed_floors(v)]
            out += [f"- {md(r)}" for r in view.other_reasons(v)]
    if covers := view.coverage():
        out += ["", "## What each confidence covers", ""]
        out += [f"- {md_code(name)}: {md(text)}" for name, text in covers]
    if rows := view.sequential():
        out += ["", "## Sequential evaluation", ""]
        out.append("| artifact | suite | items used | stopped | seconds | saved (estimate) |")
        out.append("| --- | --- | --- | --- | --- | --- |")
        out += ["| " + " | ".join(md(c) for c in row) + " |" for row in rows]
    out += repair_section.markdown_lines(report)
    marginal = [(v, f) for v in view.verdicts if v.verdict == "pass" for f in v.floors if f.marginal]
    if marginal:
        out += ["", "## Marginal passes (within the machine-to-machine spread of a floor)", ""]
        out += [f"- {md(v.artifact)} × {md(v.tenant)}: {_floor_line(f)[2:]}" for v, f in marginal]
    out += [
        "",
        "## Numerics",
        "",
        "| model | mode | weights | activations | KV cache | native on |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for model, n in numerics.items():
        mode = n.get("mode", "unknown") + (f" on {n['device']}" if n.get("device") else "")
        if n.get("tensor_parallel", 1) > 1:
            mode += f" x{n['tensor_parallel']} (tensor parallel)"
        out.append(
            f"| {md(model)} | {md(mode)} | {md(n.get('weights', '—'))} | {md(n.get('activations', '—'))} | "
            f"{md(n.get('kv_cache', '—'))} | {md(', '.join(n.get('native_on') or []) or '—')} |"
        )
    sizes = view.sizes()
    if sizes:
        base = sizes.get("source")
        out += ["", "## Size", "", "| model | bytes | vs source |", "| --- | ---: | ---: |"]
        for model, size in sizes.items():
            rel = f"{size / base:.1%}" if base and size is not None and model != "source" else "—"
            shown = f"{size} ({format_bytes(size)})" if size is not None else "—"
            out.append(f"| {md(model)} | {shown} | {rel} |")
    serving = view.serving()
    if serving:
        out += [
            "",
            "## Serving",
            "",
            "| artifact | engine | loads at TP | refused TP (first reason) |",
            "| --- | --- | --- | --- |",
        ]
        out += [
            f"| {md(a)} | {md(engine)} | {md(loads)} | {md(refused)} |"
            for a, engine, loads, refused in serving
        ]
    skipped = view.skipped()
    if skipped:
        out += ["", "## Suites not run (they could not change a verdict)", ""]
        out += [f"- {md(a)} {md_code(suite)}: {md(why)}" for a, suite, why in skipped]
    no_evidence = view.no_evidence()
    if no_evidence:
        out += ["", "## Suites with no evidence on this model", ""]
        out += [f"- {md_code(suite)}: {md('; '.join(why))}" for suite, why in no_evidence.items()]
    against = view.serving_deltas()
    if report.baselines_from or against:
        out += ["", "## Against what is serving", ""]
        out.append(f"approved versions looked up in: {md(report.baselines_from or 'nowhere')}")
        out += [f"\n> {md(note)}" for note in report.baseline_notes]
    if against:
        out += [
            "",
            "| artifact | tenant | approved | floor | before | now | change | status |",
            "| --- | --- | --- | --- | ---: | ---: | ---: | --- |",
        ]
        for artifact, tenant, version, f in against:
            now = f.before + f.delta if f.before is not None and f.delta is not None else None
            change = f.delta
            out.append(
                f"| {md(artifact)} | {md(tenant)} | {md(version)} | {md(f.suite)} {md(f.metric)} "
                f"{md(f.kind_of_floor)} {fmt(f.floor)} | {fmt(f.before)} | {fmt(now)} | "
                f"{fmt(change, sign=True)} | {md(status_text(f.status))} |"
            )
    deltas = view.previous_deltas()
    if deltas and report.previous is not None:
        out += [
            "",
            f"## Against the previous approved version ({md((report.previous.source_hash or '')[:12])})",
            "",
            "| artifact | metric | before | after | change |",
            "| --- | --- | ---: | ---: | ---: |",
        ]
        for artifact, key, before, after, delta in deltas:
            out.append(
                f"| {md(artifact)} | {md(key)} | {fmt(before)} | {fmt(after)} | {fmt(delta, sign=True)} |"
            )
    return "\n".join(out).rstrip() + "\n"
