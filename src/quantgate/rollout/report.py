"""The rollout report (JSON, Markdown, HTML): each floor's tests over the looks, the decision and
why, and the before/after KPI delta the version landed with.

Read from the watcher's state in the registry (``publish.state_tag``), so any machine can write
it at any time. The plot is the tests' log capital per look against ``log(1/alpha)``: a test
rejects when its line crosses it (the confidence sequence's end crossing the floor, in the form
the decision uses). Drawn as SVG by hand: no plotting dependency on a fleet machine.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

from quantgate.runtime.atomic import write_text

W, H, PAD = 640, 220, 40


def _p99(counts: list[int], bounds: list[str]) -> float | None:
    total = counts[-1] if counts else 0
    if not total:
        return None
    return next(float(b) for b, c in zip(bounds, counts, strict=True) if c >= 0.99 * total)


def kpi_delta(state: dict) -> dict:
    """Stable against canary on the last look's totals: p99 per latency metric, error rate."""
    prev = (state.get("look_state") or {}).get("prev") or {}
    out: dict = {}
    s, c = prev.get("stable") or {}, prev.get("canary") or {}
    for metric, counts in (c.get("latency") or {}).items():
        a = _p99((s.get("latency") or {}).get(metric) or [], (s.get("bounds") or {}).get(metric) or [])
        b = _p99(counts, (c.get("bounds") or {}).get(metric) or [])
        out[f"p99 {metric} (s)"] = {
            "stable": a,
            "canary": b,
            "delta": None if not a or b is None else b / a - 1,
        }
    rate = {
        k: (v.get("errors", 0) / v["requests"] if v.get("requests") else None)
        for k, v in (("stable", s), ("canary", c))
    }
    before, after = rate["stable"], rate["canary"]
    out["error rate"] = {**rate, "delta": None if before is None or after is None else after - before}
    return out


def _svg(history: list[dict], threshold: float) -> str:
    names = sorted({n for h in history for n in h.get("floors", {})})
    values = [v for h in history for f in h.get("floors", {}).values() for v in f[:2]] + [threshold, 0.0]
    top, bottom = max(values), min(min(values), -1.0)
    n = max(len(history), 2)

    def xy(i: int, v: float) -> str:
        return f"{PAD + i * (W - 2 * PAD) / (n - 1):.1f},{H - PAD - (v - bottom) * (H - 2 * PAD) / (top - bottom or 1):.1f}"

    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H + 20 * len(names)}">',
        f'<polyline points="{xy(0, threshold)} {xy(n - 1, threshold)}" stroke="#888" stroke-dasharray="4" fill="none"/>',
        f'<text x="{PAD}" y="{H - 5}" font-size="11">looks 1..{len(history)}; dashed: log(1/alpha) = {threshold:.2f}</text>',
    ]
    for k, name in enumerate(names):
        color = colors[k % len(colors)]
        for j, dash in ((0, ""), (1, ' stroke-dasharray="2"')):
            pts = " ".join(
                xy(i, h["floors"][name][j]) for i, h in enumerate(history) if name in h.get("floors", {})
            )
            parts.append(f'<polyline points="{pts}" stroke="{color}" fill="none"{dash}/>')
        parts.append(
            f'<text x="{PAD}" y="{H + 15 + 20 * k}" font-size="11" fill="{color}">'
            f"{html.escape(name)}: solid = fail test, dotted = pass test</text>"
        )
    return "\n".join([*parts, "</svg>"])


def write_report(state: dict, status: dict, out: Path, alpha: float) -> dict[str, Path]:
    """report.json, report.md, report.html and tests.svg under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    history = (state.get("look_state") or {}).get("history") or []
    decision = state.get("last") or {}
    outcome = state.get("outcome") or {}
    delta = kpi_delta(state)
    body = {
        "status": status,
        "decision": decision,
        "outcome": outcome,
        "kpi_delta": delta,
        "history": history,
    }
    svg = _svg(history, math.log(1 / alpha)) if history else "<svg xmlns='http://www.w3.org/2000/svg'/>"
    rows = "\n".join(
        f"| {k} | {v.get('stable')} | {v.get('canary')} | {v.get('delta')} |" for k, v in delta.items()
    )
    floors = "\n".join(f"| {f['name']} | {f['status']} | {f['detail']} |" for f in decision.get("floors", []))
    md = (
        f"# Rollout of {status.get('registered_model')} for {status.get('tenant')}\n\n"
        f"**{outcome.get('action') or decision.get('action')}** at look {decision.get('look')}: "
        f"{outcome.get('reason') or decision.get('reason')}\n\n"
        f"Shares: {json.dumps(status.get('shares'))}\n\n"
        f"| floor | status | evidence |\n|---|---|---|\n{floors}\n\n"
        f"## Before/after KPI delta\n\n| KPI | stable | canary | delta |\n|---|---|---|---|\n{rows}\n\n"
        "## Tests over the looks\n\n![tests](tests.svg)\n"
    )
    paths = {
        "json": out / "report.json",
        "md": out / "report.md",
        "html": out / "report.html",
        "svg": out / "tests.svg",
    }
    write_text(paths["json"], json.dumps(body, indent=1, default=str))
    write_text(paths["md"], md)
    write_text(paths["svg"], svg)
    write_text(paths["html"], f"<html><body><pre>{html.escape(md)}</pre>{svg}</body></html>")
    return paths
