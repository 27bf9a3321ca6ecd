"""A wrongly typed report.json (issue 25) is refused at the file, naming the field: exit 2, one line.

Before: ``numerics``, ``metrics`` and ``sequential`` were ``Any`` below their first levels, so
``quantgate report`` (and the gate's own table, and publish) ended in a TypeError or ValueError
traceback deep inside a renderer; a repair whose chosen k no probe tried ended in StopIteration;
a size of null crashed the HTML report.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from quantgate.contracts.report_schema import read_report
from quantgate.report import render_html, render_markdown
from quantgate.runtime.errors import ReportError
from support.cli import quantgate

pytestmark = pytest.mark.unit

REPAIR = {
    "target": "hopper-fp8",
    "upgrade": "bf16",
    "units": 2,
    "uniform_bytes": 100,
    "parent_build_key": "k" * 64,
    "sensitivity_seconds": 1.0,
    "sensitivity_cached": True,
    "kld_uniform": 0.3,
    "ranked": [],
    "budget": 3,
    "probes": [],
    "tenants": [{"tenant": "chat", "k": 5, "stopped": "bracket closed"}],
    "seconds": 1.0,
}


def _first(mapping: dict) -> str:
    return next(iter(mapping))


CASES: dict[str, tuple[Callable[[dict], None], str]] = {
    "numerics-mode": (lambda r: r["numerics"][_first(r["numerics"])].update(mode=5), "numerics.{a}.mode"),
    "numerics-native-on": (
        lambda r: r["numerics"][_first(r["numerics"])].update(native_on=5),
        "numerics.{a}.native_on",
    ),
    "numerics-notes": (
        lambda r: r["numerics"][_first(r["numerics"])].update(notes=[5]),
        "numerics.{a}.notes.0",
    ),
    "metrics-text": (
        lambda r: r["metrics"]["hopper-fp8"]["wikitext"].update(top1_agreement="high"),
        "metrics.hopper-fp8.wikitext.top1_agreement",
    ),
    "sequential-seconds": (
        lambda r: r.update(sequential={"hopper-fp8": {"wikitext": {"items_used": 1, "seconds": "slow"}}}),
        "sequential.hopper-fp8.wikitext.seconds",
    ),
    "repair-k-never-tried": (lambda r: r.update(repairs=[REPAIR]), "repairs.0"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_wrongly_typed_field_is_named_at_the_file(e1_report, tmp_path, case):
    change, field = CASES[case]
    change(e1_report)
    path = tmp_path / "report.json"
    path.write_text(json.dumps(e1_report))
    field = field.format(a=_first(e1_report["numerics"]))
    with pytest.raises(ReportError) as err:
        read_report(path)
    message = str(err.value)
    assert message.startswith(f"{path}: not a readable gate report ({field}: ") and "\n" not in message


@pytest.mark.heavy
def test_quantgate_report_refuses_it_in_one_line(e1_report, tmp_path):
    e1_report["numerics"][_first(e1_report["numerics"])]["mode"] = 5
    (tmp_path / "report.json").write_text(json.dumps(e1_report))
    run = quantgate("report", "--report", str(tmp_path))
    assert run.returncode == 2 and "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "report.json: not a readable gate report (numerics." in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]  # nothing rendered


@pytest.mark.heavy
def test_an_unknown_size_renders(e1_report):
    """``sizes`` allows null (a size not measured): both formats show a dash."""
    e1_report["sizes"] = {"source": 100, "hopper-fp8": None}
    assert "| hopper-fp8 | — | — |" in render_markdown(e1_report)
    assert '<tr><th>hopper-fp8</th><td class="num">—</td>' in render_html(e1_report)
