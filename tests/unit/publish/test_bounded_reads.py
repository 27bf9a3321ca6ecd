"""What the registry hands back is read within bounds: a gate report by size and nesting depth,
a manifest's signature by size before a byte of it is read. Against a real SQLite registry and a
local store, and the command line."""

from __future__ import annotations

import tracemalloc

import pytest
from mlflow import MlflowClient

from quantgate.contracts.report_schema import read_report
from quantgate.publish import naming, publish_report, pull
from quantgate.publish.local_store import local_path
from quantgate.publish.signing import SIGNATURE
from quantgate.runtime.errors import ReportError, SignatureError, UnapprovedVersionError
from support.artifacts import MODEL, installed_entries, write_artifact, write_report
from support.cli import quantgate

pytestmark = pytest.mark.unit

NESTED = "[" * 100_000 + "]" * 100_000


def test_a_report_nested_100k_deep_is_refused_in_one_line(tmp_path):
    (tmp_path / "report.json").write_text(NESTED)
    with pytest.raises(ReportError, match="nested deeper") as err:
        read_report(tmp_path / "report.json")
    assert err.value.exit_code == 2 and "\n" not in str(err.value)
    assert str(err.value).startswith(str(tmp_path / "report.json"))
    done = quantgate("report", "--report", str(tmp_path))  # was: RecursionError, a traceback, exit 1
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().count("\n") == 0 and "nested deeper" in done.stderr
    assert not (tmp_path / "report.md").exists()


@pytest.mark.heavy
def test_the_approved_versions_nested_report_is_a_baseline_problem_not_a_crash(published, registry, tmp_path):
    """quantgate gate compares with the approved version's report.json from the store: one nested
    100,000 deep crashed it (RecursionError). Now that baseline says why it has no report."""
    from quantgate.gate.baseline import from_registry

    stored = local_path(published.source).parent / naming.REPORTS_PATH / "report.json"
    stored.write_text(NESTED)
    found = from_registry(registry, MODEL, {"hopper-fp8": None})
    (chat,) = [b for b in found.found if b.tenant == "chat"]
    assert chat.report is None and "nested deeper" in chat.problem


@pytest.mark.heavy
def test_quantgate_gate_with_the_approved_versions_report_nested_100k_deep(repo_root, registry, tmp_path):
    """The attack through the command line: ``quantgate gate`` of a real (trimmed) evaluation,
    whose hopper-fp8 the registry approves with a gate report nested 100,000 deep."""
    import json
    import shutil
    from pathlib import Path

    results = Path(
        shutil.copytree(repo_root / "tests" / "unit" / "gate" / "fixtures" / "e1", tmp_path / "e1")
    )
    model = json.loads((results / "run.json").read_text())["model"]
    write_artifact(tmp_path / "arts" / "hopper-fp8", "hopper-fp8", {"model.safetensors": b"\1" * 1000})
    published = publish_report(
        write_report(tmp_path / "R0", {"hopper-fp8": ["chat"]}, model=model), tmp_path / "arts", registry
    ).artifacts[0]
    (local_path(published.source).parent / naming.REPORTS_PATH / "report.json").write_text(NESTED)
    env = {"MLFLOW_TRACKING_URI": registry.tracking_uri, "QUANTGATE_ARTIFACT_URI": registry.artifact_uri}
    args = ["--results", str(results), "--root", str(repo_root), "--model-class", "draft"]
    done = quantgate("gate", *args, "--out", str(tmp_path / "R"), env=env, timeout=600)
    assert done.returncode in (0, 1), done.stderr[-3000:]  # 1: a required artifact passes no tenant
    assert "Traceback" not in done.stderr and "RecursionError" not in done.stderr  # was: both, exit 1
    assert json.loads((tmp_path / "R" / "report.json").read_text())["model"] == model


def test_a_report_over_the_size_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    from quantgate.contracts import report_schema

    monkeypatch.setattr(report_schema, "MAX_REPORT_BYTES", 1000)  # the limit, lowered for the test
    (tmp_path / "report.json").write_text('{"model": "' + "x" * 2000 + '"}')
    with pytest.raises(ReportError, match="over the 1,000-byte limit"):
        read_report(tmp_path / "report.json")


@pytest.mark.heavy
def test_a_huge_manifest_signature_is_refused_by_its_size_before_it_is_read(published, registry, pull_cache):
    """A 600 MB manifest.sig cost 2 GB of memory before its refusal (read whole, then parsed).
    Here 60 MB: refused by its size, and pull's peak allocation stays far below the file."""
    signature = local_path(published.source) / SIGNATURE
    with open(signature, "wb") as fh:
        fh.write(b'{"mediaType": "' + b"A" * 60_000_000 + b'"}')
    with pytest.raises(UnapprovedVersionError):  # MLflow's modules imported before measuring
        pull(MODEL, "hopper-fp8", "code", registry, cache_dir=pull_cache)
    tracemalloc.start()
    try:
        with pytest.raises(SignatureError, match="over the 64,000-byte limit") as err:
            pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert err.value.exit_code == 2 and "\n" not in str(err.value)
    assert str(err.value).startswith(f"{published.source}/{SIGNATURE}")
    assert peak < 20_000_000, f"{peak:,} bytes allocated"  # before the fix: over 120 MB
    assert installed_entries(pull_cache) == []
    assert not list((pull_cache / "pull" / ".partial").rglob(SIGNATURE))


@pytest.mark.heavy
def test_a_huge_approval_tag_is_refused_before_it_is_parsed(published, registry, pull_cache):
    client = MlflowClient(tracking_uri=registry.tracking_uri, registry_uri=registry.model_registry_uri)
    client.set_model_version_tag(
        published.registered_model, published.version, naming.APPROVAL_SIGNATURE, "A" * 90_000
    )
    with pytest.raises(SignatureError, match="longer than quantgate writes"):
        pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)


def test_publish_reads_its_report_within_bounds(artifacts, registry, tmp_path):
    (tmp_path / "gate").mkdir()
    (tmp_path / "gate" / "report.json").write_text(NESTED)
    with pytest.raises(ReportError, match="nested deeper"):
        publish_report(tmp_path / "gate" / "report.json", artifacts, registry)
