"""Figures for the HTML report, as inline ``data:image/png;base64`` URIs.

matplotlib through ``Figure`` (Agg canvas, no pyplot, no global backend), a fixed rc context
(no math parsing of names, fixed DPI and font) and PNG metadata without the Software tag, so
the same report gives the same bytes.
"""

from __future__ import annotations

import base64
import io
import math
from typing import TYPE_CHECKING, Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from quantgate.contracts.report_schema import STATUS_TEXT, FloorResult, TargetRepair

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType  # annotations only: not imported at run time

RC: dict[RcKeyType, Any] = {
    "text.parse_math": False,
    "font.size": 8,
    "figure.dpi": 100,
    "savefig.dpi": 100,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "path.simplify": False,
}
PASS, FAIL, GREY = "#1a7f37", "#cf222e", "#6e7781"


def _png(fig: Figure) -> str:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def floors_figure(tenant: str, rows: list[tuple[str, FloorResult]]) -> str | None:
    """One panel per floor of a tenant: each artifact's estimate (dot) and bound (bar end), the floor a line."""
    panels: dict[tuple[str, str, str, float], list[tuple[str, FloorResult]]] = {}
    for artifact, f in rows:
        panels.setdefault((f.suite, f.metric, f.kind_of_floor, f.floor), []).append((artifact, f))
    if not panels:
        return None
    with matplotlib.rc_context(RC):
        cols = min(4, len(panels))
        nrows = math.ceil(len(panels) / cols)
        fig = Figure(figsize=(3.0 * cols, 2.1 * nrows + 0.4), layout="constrained")
        axes = fig.subplots(nrows, cols, squeeze=False).ravel()
        # the grid may hold more axes than panels: the spare ones are hidden below
        for ax, ((suite, metric, kind, floor), items) in zip(axes, panels.items(), strict=False):
            for i, (_, f) in enumerate(items):
                color = {"pass": PASS, "fail": FAIL}.get(f.status, GREY)
                est, bound = f.estimate, f.bound
                if _finite(est) and _finite(bound):
                    ax.plot([i, i], [est, bound], color=color, linewidth=3, alpha=0.5)
                if _finite(est):
                    ax.plot([i], [est], "o", color=color)
                else:
                    ax.annotate(
                        "n/a" if f.status == "uninformative" else STATUS_TEXT.get(f.status, f.status),
                        (i, floor),
                        ha="center",
                        va="bottom",
                        rotation=90,
                        color=GREY,
                    )
            ax.axhline(floor, color="black", linestyle="--", linewidth=1)
            ax.set_xticks(range(len(items)), [a for a, _ in items], rotation=20, ha="right")
            ax.set_xlim(-0.6, len(items) - 0.4)
            ax.set_title(f"{suite} {metric}\n{kind} {floor:g}", fontsize=8)
        for ax in axes[len(panels) :]:
            ax.set_visible(False)
        fig.suptitle(f"tenant {tenant}: estimate (dot), conservative bound (bar end), floor (dashed)")
        return _png(fig)


def long_chain_figure(bins: dict[str, dict[str, list[float | None]]]) -> str:
    """KL divergence and agreement per position bin, one line per model."""
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(9, 2.8), layout="constrained")
        ax_kld, ax_agr = fig.subplots(1, 2)
        for model, series in bins.items():
            for ax, key in ((ax_kld, "kld"), (ax_agr, "agreement")):
                ys = [y if _finite(y) else math.nan for y in series.get(key) or []]
                if ys:
                    ax.plot(range(1, len(ys) + 1), ys, marker="o", label=model)
        for ax, title in ((ax_kld, "KL divergence to source"), (ax_agr, "top-1 agreement with source")):
            ax.set_title(f"long-chain: {title} by position bin")
            ax.set_xlabel("position bin (1 = start of the trace)")
            ax.xaxis.get_major_locator().set_params(integer=True)
        ax_agr.legend(fontsize=7)
        return _png(fig)


def recovery_figure(recovery: dict[str, dict[str, float]]) -> str:
    """Artifact / source per suite, grouped bars, the source's level a line at 1."""
    artifacts = list(dict.fromkeys(a for values in recovery.values() for a in values))
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(9, 2.8), layout="constrained")
        ax = fig.subplots()
        width = 0.8 / max(1, len(artifacts))
        for j, artifact in enumerate(artifacts):
            xs = [
                i + (j - (len(artifacts) - 1) / 2) * width
                for i, v in enumerate(recovery.values())
                if artifact in v
            ]
            ys = [v[artifact] for v in recovery.values() if artifact in v]
            ax.bar(xs, ys, width=width, label=artifact)
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
        ax.set_xticks(range(len(recovery)), list(recovery))
        ax.set_ylabel("artifact / source")
        ax.set_title("recovery per suite (1 = the source's level)")
        ax.legend(fontsize=7)
        return _png(fig)


def frontier_figure(repair: TargetRepair) -> str:
    """Bytes against quality for every variant a repair tried: one panel per floor metric, the
    uniform artifact at k = 0, passing variants green, the chosen ones ringed."""
    # divergence and agreement first: they move with every group kept; accuracy flips on a few items do not
    rank = {"kld_mean": 0, "top1_agreement": 1, "kld_p99": 2}
    found = {q for p in repair.probes for q in p.quality}
    keys = sorted(found, key=lambda q: (rank.get(q.rsplit(".", 1)[-1], 3), q))[:3] or ["(no metric)"]
    chosen = {t.k for t in repair.tenants if t.k is not None}
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(3.2 * len(keys), 2.8), layout="constrained")
        axes = fig.subplots(1, len(keys), squeeze=False)[0]
        probes = sorted(repair.probes, key=lambda p: p.bytes)
        for ax, key in zip(axes, keys, strict=True):
            xs = [p.bytes / 1e6 for p in probes if key in p.quality]
            ys = [p.quality[key] for p in probes if key in p.quality]
            colors = [PASS if p.passed else FAIL for p in probes if key in p.quality]
            ax.plot(xs, ys, color=GREY, linewidth=1)
            ax.scatter(xs, ys, c=colors, zorder=3)
            for p in probes:
                if key in p.quality:
                    ax.annotate(
                        f"k={p.k}",
                        (p.bytes / 1e6, p.quality[key]),
                        fontsize=7,
                        xytext=(3, 3),
                        textcoords="offset points",
                    )
                    if p.k in chosen:
                        ax.scatter(
                            [p.bytes / 1e6],
                            [p.quality[key]],
                            s=120,
                            facecolors="none",
                            edgecolors=PASS,
                            zorder=4,
                        )
            ax.axvline(repair.uniform_bytes / 1e6, color=FAIL, linestyle=":", linewidth=1)
            ax.set_xlabel("MB on disk (dotted: uniform)")
            ax.set_title(f"{repair.target}: {key}")
        return _png(fig)
