"""``render_html``: one self-contained page (inline CSS and PNGs, no JS, no network), verdicts first."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jinja2 import Environment, StrictUndefined

from quantgate.contracts.report_schema import Report, as_report
from quantgate.report import plots, repair_section
from quantgate.report.view import View, fmt, status_text
from quantgate.runtime.units import format_bytes

TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>quantgate report: {{ r.model }}</title>
<style>
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.2rem 2rem;color:#1f2328;font-size:14px}
h1{font-size:1.4rem;margin:.2rem 0}h2{font-size:1.15rem;margin-top:1.6rem;border-bottom:1px solid #d0d7de}
h3{font-size:1rem;margin:.2rem 0;display:inline}
.headline{font-weight:600;padding:.5rem .8rem;border-radius:6px;margin:.5rem 0}
.ok{background:#dafbe1}.bad{background:#ffebe9}.meta{color:#57606a}
table{border-collapse:collapse;margin:.4rem 0}th,td{border:1px solid #d0d7de;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#f6f8fa}td.num{text-align:right;font-variant-numeric:tabular-nums}
td.pass{background:#dafbe1;color:#1a7f37;font-weight:600}td.fail,td.missing,td.error,td.not_run{background:#ffebe9;color:#cf222e;font-weight:600}
td a{color:inherit;text-decoration:none}b.pass{color:#1a7f37}b.fail{color:#cf222e}
td.uninformative,td.insufficient_evidence,td.violation{background:#fff8c5;color:#7d4e00}td.no_baseline,td.none{color:#8c959f}
details{margin:.4rem 0;border:1px solid #d0d7de;border-radius:6px;padding:.3rem .6rem}
td.reason{font-size:12px;color:#57606a;max-width:48rem}img{max-width:100%}
</style></head><body>
<h1>quantgate gate report: {{ r.model }}</h1>
<p class="headline {{ 'ok' if r.exit_code == 0 else 'bad' }}">{{ headline }}</p>
<p class="meta">model class {{ r.model_class }} · profile {{ r.profile }} · source {{ (r.source_hash or 'unknown')[:12] }} · report schema {{ r.schema_version }}</p>
{% for note in r.notes or [] %}<p class="meta">Note: {{ note }}</p>{% endfor %}
<table id="verdicts"><thead><tr><th>artifact</th><th>role</th><th>numerics</th>{% for t in tenants %}<th>{{ t }}</th>{% endfor %}</tr></thead><tbody>
{% for a in artifacts %}<tr><th>{{ a }}</th><td>{{ view.role(a) }}</td><td>{{ (numerics.get(a) or {}).get('mode', 'unknown') }}</td>
{% for t in tenants %}{% set c = view.cell(a, t) %}{% if c %}<td class="{{ c.verdict }}"><a href="#{{ anchors[(a, t)] }}">{{ c.verdict }}</a>{% if c.marginal %} ⚠ marginal{% endif %}</td>{% else %}<td class="none">—</td>{% endif %}{% endfor %}</tr>
{% endfor %}</tbody></table>

<h2>Floors per artifact and tenant</h2>
{% for v in verdicts %}<details id="{{ anchors[(v.artifact, v.tenant)] }}"{% if v.verdict != 'pass' %} open{% endif %}>
<summary><h3>{{ v.artifact }} × {{ v.tenant }}</h3> ({{ view.role(v.artifact) }}): <b class="{{ v.verdict }}">{{ v.verdict }}</b></summary>
<ul>{% for reason in view.other_reasons(v) %}<li>{{ reason }}</li>{% endfor %}</ul>
{% if v.baseline %}<p class="meta">compared with {% if v.baseline.version %}version {{ v.baseline.version }} of {{ v.baseline.registered_model }}{% else %}{{ v.baseline.origin }}{% endif %}, approved for {{ v.tenant }}</p>{% endif %}
<table><thead><tr><th>suite</th><th>metric</th><th>floor kind</th><th>estimate</th><th>bound (which end)</th><th>floor</th><th>margin</th><th>unchanged artifact's end, from no change</th><th>tolerance</th><th>before</th><th>change</th><th>status</th><th>reason</th></tr></thead><tbody>
{% for f in v.floors %}<tr><td>{{ f.suite }}</td><td>{{ f.metric }}</td><td>{{ f.kind_of_floor }}{% if f.advisory %} (advisory){% endif %}</td><td class="num">{{ fmt(f.estimate) }}</td>
<td class="num">{{ fmt(f.bound, f.floor) }}{% if f.end %} ({{ f.end }}){% endif %}</td><td class="num">{{ fmt(f.floor, f.bound) }}</td><td class="num">{{ fmt(f.margin, sign=True) }}</td>
<td class="num">{{ fmt(f.mde) }}</td><td class="num">{{ fmt(f.tolerance) }}</td><td class="num">{{ fmt(f.before) }}</td><td class="num">{{ fmt(f.delta, sign=True) }}</td>
<td class="{{ f.status }}">{{ status_text(f.status) }}{% if f.marginal %} ⚠ marginal{% endif %}</td><td class="reason">{{ f.reason }}</td></tr>
{% endfor %}</tbody></table></details>
{% endfor %}

{% if coverage %}<h2 id="coverage">What each confidence covers</h2>
<ul>{% for name, text in coverage %}<li><b>{{ name }}</b>: {{ text }}</li>{% endfor %}</ul>{% endif %}
{% if skipped %}<h2 id="not-run">Suites not run (they could not change a verdict)</h2>
<ul>{% for artifact, suite, why in skipped %}<li><b>{{ artifact }}</b> {{ suite }}: {{ why }}</li>{% endfor %}</ul>{% endif %}
{% if no_evidence %}<h2 id="no-evidence">Suites with no evidence on this model</h2>
<ul>{% for suite, why in no_evidence.items() %}<li><b>{{ suite }}</b>: {{ why | join('; ') }}</li>{% endfor %}</ul>{% endif %}
{% if r.baselines_from or serving_deltas %}<h2 id="serving-deltas">Against what is serving</h2>
<p class="meta">approved versions looked up in: {{ r.baselines_from or 'nowhere' }}</p>
{% for note in r.baseline_notes %}<p class="meta">Note: {{ note }}</p>{% endfor %}
{% if serving_deltas %}<table><thead><tr><th>artifact</th><th>tenant</th><th>approved</th><th>floor</th><th>before</th><th>now</th><th>change</th><th>status</th></tr></thead><tbody>
{% for a, tenant, version, f in serving_deltas %}<tr><th>{{ a }}</th><td>{{ tenant }}</td><td>{{ version }}</td><td>{{ f.suite }} {{ f.metric }} {{ f.kind_of_floor }} {{ fmt(f.floor) }}</td>
<td class="num">{{ fmt(f.before) }}</td><td class="num">{{ fmt(f.before + f.delta if f.before is not none and f.delta is not none else none) }}</td><td class="num">{{ fmt(f.delta, sign=True) }}</td><td class="{{ f.status }}">{{ status_text(f.status) }}</td></tr>
{% endfor %}</tbody></table>{% endif %}{% endif %}

{% if sequential %}<h2 id="sequential">Sequential evaluation</h2>
<p class="meta">Each suite stopped once every floor on it was decided (always-valid bounds), or ran out of items.</p>
<table><thead><tr><th>artifact</th><th>suite</th><th>items used</th><th>stopped</th><th>seconds</th><th>saved (estimate)</th></tr></thead><tbody>
{% for a, suite, used, stopped, seconds, saved in sequential %}<tr><th>{{ a }}</th><td>{{ suite }}</td><td class="num">{{ used }}</td><td>{{ stopped }}</td><td class="num">{{ seconds }}</td><td class="num">{{ saved }}</td></tr>
{% endfor %}</tbody></table>{% endif %}
{% if repairs %}<h2 id="repair">Repair (mixed-precision variants of failed targets)</h2>
{% for repair, lines, header, rows, uri in repairs %}<h3>{{ repair.target }}: layer groups kept at {{ repair.upgrade }}</h3>
<ul>{% for line in lines %}<li>{{ line }}</li>{% endfor %}</ul>
<table><thead><tr>{% for h in header %}<th>{{ h }}</th>{% endfor %}</tr></thead><tbody>
{% for row in rows %}<tr>{% for cell in row %}<td>{{ cell }}</td>{% endfor %}</tr>{% endfor %}</tbody></table>
<p><img alt="bytes against quality of every variant of {{ repair.target }}" src="{{ uri }}"></p>
{% endfor %}{% endif %}
<h2>Metrics against floors</h2>
{% for tenant, uri in floor_plots %}<p><img alt="floors of tenant {{ tenant }}" src="{{ uri }}"></p>{% endfor %}
<h2>Long-chain: KL divergence and agreement by position</h2>
{% if long_chain %}<p><img alt="long-chain by position" src="{{ long_chain }}"></p>{% else %}<p class="meta">Not in this report (report.json has no per-bin long-chain metrics).</p>{% endif %}
<h2>Recovery per suite</h2>
{% if recovery %}<p><img alt="recovery per suite" src="{{ recovery }}"></p>{% else %}<p class="meta">No recovery values in this report.</p>{% endif %}

<h2>Numerics</h2>
<table><thead><tr><th>model</th><th>mode</th><th>weights</th><th>activations</th><th>KV cache</th><th>native on</th><th>notes</th></tr></thead><tbody>
{% for m, n in numerics.items() %}<tr><th>{{ m }}</th><td>{{ n.get('mode', 'unknown') }}{% if n.get('device') %} on {{ n.device }}{% endif %}{% if n.get('tensor_parallel', 1) > 1 %} x{{ n.tensor_parallel }} (tensor parallel){% endif %}</td><td>{{ n.get('weights', '—') }}</td>
<td>{{ n.get('activations', '—') }}</td><td>{{ n.get('kv_cache', '—') }}</td><td>{{ (n.get('native_on') or []) | join(', ') or '—' }}</td>
<td class="reason">{% for note in n.get('notes') or [] %}{{ note }}{% if not loop.last %}<br>{% endif %}{% endfor %}</td></tr>
{% endfor %}</tbody></table>
{% if sizes %}<h2>Size</h2>
<table><thead><tr><th>model</th><th>bytes</th><th>vs source</th></tr></thead><tbody>
{% for m, n in sizes.items() %}<tr><th>{{ m }}</th>{% if n is none %}<td class="num">—</td><td class="num">—</td>{% else %}<td class="num">{{ n }} ({{ fmt_bytes(n) }})</td><td class="num">{% if sizes.get('source') and m != 'source' %}{{ '%.1f%%' % (100 * n / sizes.source) }}{% else %}—{% endif %}</td>{% endif %}</tr>
{% endfor %}</tbody></table>{% endif %}
{% if serving %}<h2>Serving</h2>
<table id="serving"><thead><tr><th>artifact</th><th>engine</th><th>loads at TP</th><th>refused TP (first reason)</th></tr></thead><tbody>
{% for a, engine, loads, refused in serving %}<tr><th>{{ a }}</th><td>{{ engine }}</td><td>{{ loads }}</td><td class="reason">{{ refused }}</td></tr>
{% endfor %}</tbody></table>{% endif %}
{% if deltas %}<h2 id="previous">Against the previous approved version ({{ (r.previous.source_hash or '')[:12] }})</h2>
<table><thead><tr><th>artifact</th><th>metric</th><th>before</th><th>after</th><th>change</th></tr></thead><tbody>
{% for a, k, before, after, delta in deltas %}<tr><th>{{ a }}</th><td>{{ k }}</td><td class="num">{{ fmt(before) }}</td><td class="num">{{ fmt(after) }}</td><td class="num">{{ fmt(delta, sign=True) }}</td></tr>
{% endfor %}</tbody></table>{% endif %}
</body></html>
"""

_ENV = Environment(autoescape=True, undefined=StrictUndefined, keep_trailing_newline=True)
_TEMPLATE = _ENV.from_string(TEMPLATE)


def render_html(report: Report | Mapping[str, Any]) -> str:
    """The report as one self-contained HTML page, the same bytes for the same report."""
    report = as_report(report)
    view = View(report)
    verdicts = view.verdicts
    anchors = {(v.artifact, v.tenant): f"v{i}" for i, v in enumerate(verdicts)}
    floor_plots = []
    for tenant in view.tenants:
        rows = [(v.artifact, f) for v in verdicts if v.tenant == tenant for f in v.floors]
        uri = plots.floors_figure(tenant, rows)
        if uri:
            floor_plots.append((tenant, uri))
    bins, recovery = view.long_chain_bins(), view.recovery()
    return _TEMPLATE.render(
        r=report,
        view=view,
        headline=view.headline(),
        tenants=view.tenants,
        artifacts=view.artifacts,
        verdicts=verdicts,
        anchors=anchors,
        numerics=view.numerics(),
        sizes=view.sizes(),
        fmt=fmt,
        status_text=status_text,
        no_evidence=view.no_evidence(),
        skipped=view.skipped(),
        coverage=view.coverage(),
        serving_deltas=view.serving_deltas(),
        fmt_bytes=format_bytes,
        floor_plots=floor_plots,
        long_chain=plots.long_chain_figure(bins) if bins else None,
        recovery=plots.recovery_figure(recovery) if recovery else None,
        deltas=view.previous_deltas(),
        serving=view.serving(),
        sequential=view.sequential(),
        repairs=[
            (r, repair_section.outcome_lines(r), *repair_section.probe_rows(r), plots.frontier_figure(r))
            for r in report.repairs
        ],
    )
