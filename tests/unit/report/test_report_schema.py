"""report.json has one typed model: the gate writes it, the reports and publish read it, and a
malformed one is refused at the file with exit code 2."""

from __future__ import annotations

import json

import pytest

from quantgate.contracts.report_schema import Report, read_report
from quantgate.runtime.errors import ReportError
from support.cli import quantgate

pytestmark = pytest.mark.unit


def test_what_the_gate_writes_reads_back_unchanged(e1_report, tmp_path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(e1_report))
    report = read_report(path)
    assert report.payload() == e1_report  # every field, in the order written
    assert report.role("blackwell-nvfp4") == "optional" and report.role("draft-int4") == "outside class"
    assert report.failed_tenants("blackwell-nvfp4") == [
        v.tenant for v in report.verdicts if v.artifact == "blackwell-nvfp4" and v.verdict == "fail"
    ]


def test_a_report_reduced_to_the_decision_still_reads(tmp_path):
    path = tmp_path / "report.json"
    path.write_text(
        json.dumps(
            {
                "schema_version": 1,
                "model": "m",
                "exit_code": 0,
                "approvals": {"a": ["chat"]},
                "verdicts": [{"artifact": "a", "tenant": "chat", "verdict": "pass", "reasons": []}],
            }
        )
    )
    report = read_report(path)
    assert report.failed_tenants("a") == [] and report.verdicts[0].floors == []


def test_a_schema_1_report_still_reads_and_renders(e1_report, tmp_path):
    """Reports written before power, errors and baselines: uninformative floors, point estimates."""
    from quantgate.report import render_markdown

    old = {k: v for k, v in e1_report.items() if k not in ("no_evidence", "baselines_from", "baseline_notes")}
    old["schema_version"] = 1
    for v in old["verdicts"]:
        v.pop("baseline")
        for f in v["floors"]:
            for key in ("mde", "tolerance", "no_change", "advisory", "before", "delta", "evidence"):
                f.pop(key)
            if f["status"] == "insufficient_evidence":
                f.update(status="uninformative", passed=None)
    old["verdicts"][0]["floors"][0].update(interval="point")
    path = tmp_path / "report.json"
    path.write_text(json.dumps(old))
    report = read_report(path)
    assert report.schema_version == 1 and "report schema 1" in render_markdown(report)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda r: r.update(aprovals=r.pop("approvals")), "aprovals: unknown key"),
        (
            lambda r: r["verdicts"][0].update(verdict="maybe"),
            "verdicts.0.verdict: Input should be 'pass' or 'fail'",
        ),
        (lambda r: r.update(schema_version=4), "schema_version: Input should be 1, 2 or 3"),
        (lambda r: r.pop("exit_code"), "exit_code: Field required"),
    ],
)
def test_a_malformed_report_names_the_file_and_the_field(e1_report, tmp_path, change, problem):
    change(e1_report)
    path = tmp_path / "report.json"
    path.write_text(json.dumps(e1_report))
    with pytest.raises(ReportError) as err:
        read_report(path)
    assert err.value.exit_code == 2 and err.value.path == str(path)
    assert problem in err.value.problem and "quantgate gate --out" in err.value.fix


def test_unreadable_or_not_json(tmp_path):
    with pytest.raises(ReportError, match="not a readable gate report"):
        read_report(tmp_path / "absent.json")
    (tmp_path / "report.json").write_text("{not json")
    with pytest.raises(ReportError, match="not JSON"):
        read_report(tmp_path / "report.json")


@pytest.mark.heavy
def test_quantgate_report_refuses_a_malformed_report_with_exit_2(e1_report, tmp_path):
    e1_report["verdicts"][0]["floors"][0]["status"] = "great"
    (tmp_path / "report.json").write_text(json.dumps(e1_report))
    run = quantgate("report", "--report", str(tmp_path), timeout=300)
    assert run.returncode == 2, run.stderr[-2000:]
    assert str(tmp_path / "report.json") in run.stderr and "verdicts.0.floors.0.status" in run.stderr
    assert "Traceback" not in run.stderr and not (tmp_path / "report.md").exists()


def test_renderers_take_the_model_or_its_json(e1_report):
    from quantgate.report import render_markdown

    assert render_markdown(Report.model_validate(e1_report)) == render_markdown(e1_report)
