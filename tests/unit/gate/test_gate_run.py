"""Gating a real (trimmed) evaluation output: approvals, exit code, report.json."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from gate_builders import edit

from quantgate.gate.run import gate_results, write_report_json
from quantgate.runtime.errors import UsageError

pytestmark = pytest.mark.unit


def decide(e1: Path, repo_root: Path, **kw):
    return gate_results(e1, repo_root / "gates.yaml", repo_root, **kw)


def verdict(decision, artifact, tenant):
    return next(v for v in decision.verdicts if v.artifact == artifact and v.tenant == tenant)


def test_real_results(e1, repo_root):
    d = decide(e1, repo_root, model_class="dense-reasoner")
    # hopper-fp8 certifies batch on 128 windows of each text suite; chat's tolerances it uses 70-82 %
    # of, which 95 % confidence needs about 256 windows for (BENCHMARKS.md, issue 43)
    assert d.approvals["hopper-fp8"] == ["batch"] and d.approvals["draft-int4"] == ["speculative"]
    chat = verdict(d, "hopper-fp8", "chat")
    assert chat.verdict == "fail" and any(
        r.startswith("wikitext perplexity change vs source (%): estimate ") for r in chat.reasons
    )
    for artifact in ("blackwell-nvfp4", "draft-int4"):
        v = verdict(d, artifact, "reasoning")
        assert v.verdict == "fail"
        assert any(
            r.startswith("wikitext kld_mean: estimate ") and "> max 0.04: FAIL" in r for r in v.reasons
        )
    # optional nvfp4 passes nothing; required rocm-cdna3-fp8 passes nothing at smoke: the run fails
    assert d.approvals["blackwell-nvfp4"] == [] and d.approvals["rocm-cdna3-fp8"] == [] and d.exit_code == 1
    assert d.required == ["hopper-fp8", "rocm-cdna3-fp8"] and d.optional == ["blackwell-nvfp4"]
    # the 135M source solves 1 of the 5 smoke GSM8K items: no floor on it can change a verdict, so it
    # was not run on the artifacts, and its advisory floors say what the source alone shows
    gsm = next(
        f
        for f in verdict(d, "hopper-fp8", "batch").floors
        if f.suite == "gsm8k" and f.kind_of_floor == "min_recovery"
    )
    assert gsm.status == "insufficient_evidence" and gsm.passed is None and gsm.informative is False
    assert gsm.evidence == "1 item the source solved (known from the source: not run)" and not gsm.powered
    # a tenant limited to draft targets gives no verdict for others
    assert not [v for v in d.verdicts if v.tenant == "speculative" and v.artifact != "draft-int4"]


def test_no_verdict_is_decided_by_a_suite_whose_source_solves_nothing(e1, repo_root):
    d = decide(e1, repo_root, model_class="draft")
    assert set(d.no_evidence) == {"gsm8k", "humaneval"}
    assert d.no_evidence == {
        "gsm8k": ["1 item the source solved (known from the source: not run) (flip_loss_rate, accuracy)"],
        "humaneval": [
            (
                "the source's flip_loss_rate base is 0 (it solves none of these items), so no answer can "
                "be lost (known from the source: not run) (flip_loss_rate)"
            ),
            (
                "the source's pass_at_1 is 0, so the ratio is undefined (0/0 or x/0) (known from the source: "
                "not run) (pass_at_1)"
            ),
        ],
    }
    for v in d.verdicts:
        for f in v.floors:
            if f.suite in ("gsm8k", "humaneval"):
                assert f.status in ("insufficient_evidence", "violation") and f.advisory, f.reason
                assert f.reason not in v.reasons or v.verdict == "pass", f.reason
    # every other floor decides: the smoke sizes give the default model's suites the power to
    assert {f.suite for v in d.verdicts for f in v.floors if f.status in ("pass", "fail")} >= {
        "wikitext",
        "traffic",
        "long-chain",
        "support-domain",
    }


def test_damaged_artifact_fails_every_tenant(e1, repo_root):
    art = e1 / "hopper-fp8"
    for suite in ("wikitext", "traffic"):

        def damage(r):
            for s in r["samples"]:
                s.update(kld_mean=2.0, top1_agreement=0.3, nll_sum=s["nll_sum"] * 2)
                s["kld_top"] = [9.0] * len(s["kld_top"])
            r["metrics"].update(kld_mean=2.0, kld_p99=9.0, top1_agreement=0.3)

        edit(art / f"{suite}.json", damage)

    for suite in ("gsm8k", "humaneval", "support-domain"):
        source = {r["item"]: r for r in json.loads((e1 / "source" / f"{suite}.json").read_text())["samples"]}

        def flip(r, source=source):  # every item flips against the source's answer
            for s in r["samples"]:
                key = (
                    "correct_flexible-extract"
                    if "correct_flexible-extract" in s
                    else "passed"
                    if "passed" in s
                    else "correct"
                )
                s[key] = not source[s["item"]][key]

        edit(art / f"{suite}.json", flip)
    d = decide(e1, repo_root, model_class="dense-reasoner")
    tenants = [v for v in d.verdicts if v.artifact == "hopper-fp8"]
    assert {v.tenant for v in tenants} == {"chat", "reasoning", "batch", "support"}
    assert all(v.verdict == "fail" for v in tenants)
    for v in tenants:  # every window beyond the class: named, whatever the test's ends
        assert any(
            "kld_mean: estimate 2, 95% upper end beyond the class > max" in r
            and "beyond the stated class" in r
            for r in v.reasons
        ), v.reasons
    assert any(
        "kld_p99: estimate 9, 95% upper end 9 > max 0.5: FAIL" in r and "beyond the stated class" in r
        for r in verdict(d, "hopper-fp8", "chat").reasons
    )
    assert any(
        r.startswith("support-domain flip_loss_rate: estimate 1, 95% upper end 1 > max 0.2: FAIL")
        for r in verdict(d, "hopper-fp8", "support").reasons
    )
    assert d.exit_code == 1 and "hopper-fp8" in d.notes[-1]


def test_code_floors_without_a_sandbox_are_errors_and_fail_the_tenant(e1, repo_root):
    """As the HumanEval suite records a run where no sandbox could be built: every item with its
    reason, no program run. Its floors are errors, and every tenant that names them fails."""
    why = "no sandbox: user namespaces are disabled here and QUANTGATE_SANDBOX=none forbids running code"

    def no_sandbox(r):
        for s in r["samples"]:
            s["error"] = why
        r["errors"] = {why: len(r["samples"])}

    for model in ("source", "hopper-fp8"):
        edit(e1 / model / "humaneval.json", no_sandbox)
    d = decide(e1, repo_root, model_class="dense-reasoner")
    for tenant in ("chat", "reasoning"):
        v = verdict(d, "hopper-fp8", tenant)
        code = [f for f in v.floors if f.suite == "humaneval"]
        assert code and all(f.status == "error" and f.passed is False for f in code)
        assert v.verdict == "fail" and any(r.startswith("humaneval ") and why in r for r in v.reasons)
    assert (
        verdict(d, "hopper-fp8", "batch").verdict
        == verdict(decide(e1, repo_root), "hopper-fp8", "batch").verdict
    )


def test_missing_suite_fails(e1, repo_root):
    (e1 / "hopper-fp8" / "wikitext.json").unlink()
    d = decide(e1, repo_root, model_class="dense-reasoner")
    v = verdict(d, "hopper-fp8", "batch")
    assert v.verdict == "fail" and any(
        "missing: suite not evaluated for the artifact" in r for r in v.reasons
    )


def test_required_target_not_evaluated_fails_the_run(e1, repo_root):
    shutil.rmtree(e1 / "rocm-cdna3-fp8")
    d = decide(e1, repo_root, model_class="dense-reasoner")
    assert d.approvals["rocm-cdna3-fp8"] == [] and d.exit_code == 1


def test_unknown_model_class_or_tenant_is_a_usage_error(e1, repo_root):
    with pytest.raises(UsageError, match="did you mean 'dense-reasoner'"):
        decide(e1, repo_root, model_class="dense-reasonr")
    with pytest.raises(UsageError, match="did you mean 'batch'"):
        decide(e1, repo_root, tenants=["bach"])


def test_report_json(e1, repo_root, tmp_path):
    d = decide(e1, repo_root, model_class="draft", model="SmolLM2-135M-Instruct")
    path = write_report_json(d, tmp_path / "R")
    report = json.loads(path.read_text())
    assert report["schema_version"] == 3 and report["model"] == "SmolLM2-135M-Instruct"
    assert report["source_hash"].startswith("678e1cc6") and report["approvals"]["draft-int4"] == [
        "speculative"
    ]
    assert report["numerics"]["hopper-fp8"]["mode"] == "emulated"
    first = report["verdicts"][0]
    assert {"artifact", "tenant", "verdict", "reasons", "floors", "required"} <= set(first)
    assert {
        "estimate",
        "bound",
        "floor",
        "margin",
        "passed",
        "informative",
        "reason",
        "mde",
        "tolerance",
    } <= set(first["floors"][0])
    # no floor shows a bound that is not an interval's end, and each interval is the one that fits its
    # statistic: exact for lost answers, bootstrap-t for ratios of sums, inversion for the p99
    intervals = {
        (f["metric"], f["interval"])
        for v in report["verdicts"]
        for f in v["floors"]
        if f["bound"] is not None
    }
    assert all(
        (f["bound"] is None) == (f["interval"] is None) for v in report["verdicts"] for f in v["floors"]
    )
    assert {("kld_mean", "betting"), ("kld_p99", "betting"), ("flip_loss_rate", "exact")} <= intervals
    # each says which end it is and what its confidence covers
    floors = [f for v in report["verdicts"] for f in v["floors"] if f["bound"] is not None]
    assert all(f["end"] in ("upper", "lower") and f["coverage"] for f in floors)
    # deterministic: the same inputs give the same report, byte for byte, with each artifact's records
    # beside it, named by their sha256 (what a later release's regressions are paired with)
    again = write_report_json(
        decide(e1, repo_root, model_class="draft", model="SmolLM2-135M-Instruct"), tmp_path / "R2", e1
    )
    assert again.read_bytes() == path.read_bytes()
    records = tmp_path / "R2" / "records" / "hopper-fp8.json"
    assert hashlib.sha256(records.read_bytes()).hexdigest() == report["records"]["hopper-fp8"]
    assert set(json.loads(records.read_text())["suites"]) == set(
        json.loads((e1 / "run.json").read_text())["suites"]
    )


@pytest.mark.heavy
def test_gating_never_imports_torch(e1, repo_root):
    """The gate reads suite kinds from the registry; their modules import torch only to run models."""
    code = (
        "import sys; from pathlib import Path; from quantgate.gate.run import gate_results; "
        f"gate_results(Path({str(e1)!r}), Path({str(repo_root / 'gates.yaml')!r}), Path({str(repo_root)!r}), "
        "model_class='dense-reasoner'); print(sorted(m for m in ('torch', 'transformers', 'lm_eval') if m in sys.modules))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[]"


def test_a_repair_variant_is_approved_by_the_gate_for_its_chosen_tenants_only(e1, repo_root):
    """Issue 26 item 6: repair asks the gate, which approves a variant only for the tenants the
    search chose it for (a variant passing another tenant earns no alias for it) and counts it as
    no required target, so the report needs no editing afterwards."""
    plain = decide(e1, repo_root, model_class="dense-reasoner")
    passed = plain.approvals["hopper-fp8"]
    assert passed == ["batch"], passed
    chosen = decide(e1, repo_root, model_class="dense-reasoner", chosen_for=["chat"])
    assert chosen.approvals["hopper-fp8"] == []  # passes batch, but was chosen for chat only
    assert all(not tenants for a, tenants in chosen.approvals.items() if a != "hopper-fp8")
    assert chosen.required == [] and chosen.exit_code == 0
    # the same decisions, only the approvals narrowed
    assert [(v.artifact, v.tenant, v.verdict) for v in chosen.verdicts] == [
        (v.artifact, v.tenant, v.verdict) for v in plain.verdicts
    ]
    assert any(n.startswith("repaired variant: ") for n in chosen.notes)
