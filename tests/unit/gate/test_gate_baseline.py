"""Before/after against what is serving: the gate compares each (artifact, tenant) with the version
the registry approves for that tenant today, through a real SQLite MLflow registry in tmp_path.

The first gate finds no registry database (a first release: regression floors report "no approved
version" and do not fail); its report is published; a second gate of the same evaluation finds
the approved versions and shows deltas per floor; an artifact made deliberately worse fails a
max_regression floor. A registry that cannot answer is exit 75, never a pass.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gate_builders import edit

from quantgate.gate.run import gate_results, write_report_json
from quantgate.publish import RegistryConfig, publish_report
from quantgate.report import render_markdown
from quantgate.runtime.errors import RegistryUnavailableError
from support.artifacts import write_artifact
from support.cli import quantgate
from support.servers import free_port

pytestmark = pytest.mark.unit

# the repository's policy plus a tenant the FP8 artifacts of e1 pass, with a regression floor their 16
# traffic windows can power (MDE 0.006 for hopper-fp8, 0.013 for rocm-cdna3-fp8; the 4-bit targets'
# 0.04 cannot decide 0.03: insufficient evidence, which fails them for this tenant)
SERVING = """
  serving:
    description: a tenant that holds artifacts to what it is served today
    floors:
      - {suite: traffic, metric: kld_mean, max: 0.5}
      - {suite: traffic, metric: kld_mean, max_regression: 0.03}
"""


@pytest.fixture
def policy(repo_root, tmp_path) -> Path:
    path = tmp_path / "gates.yaml"
    path.write_text((repo_root / "gates.yaml").read_text() + SERVING)
    return path


@pytest.fixture
def registry(tmp_path) -> RegistryConfig:
    return RegistryConfig.local(tmp_path / "registry")


def _gate(e1: Path, policy: Path, repo_root: Path, **kw):
    return gate_results(e1, policy, repo_root, model_class="draft", **kw)


def _publish(report, tmp_path: Path, registry: RegistryConfig, results: Path) -> None:
    out = tmp_path / "R1"
    path = write_report_json(report, out, results)  # with records/<artifact>.json, published too
    artifacts = tmp_path / "artifacts"
    for target in report.approvals:  # stand-ins for the built artifacts: real manifests over their bytes
        write_artifact(artifacts / target, target, {"model.safetensors": target.encode() * 1000})
    publish_report(path, artifacts, registry)


def _verdict(report, artifact: str, tenant: str):
    return next(v for v in report.verdicts if v.artifact == artifact and v.tenant == tenant)


@pytest.mark.heavy
def test_first_release_then_deltas_then_a_regression_fails(e1, repo_root, policy, registry, tmp_path):
    first = _gate(e1, policy, repo_root, registry=registry)
    assert first.baselines_from == f"registry {registry.tracking_uri}"
    assert "no approved version other than this artifact" in first.baseline_notes[0]
    assert not (tmp_path / "registry").exists()  # looking made no registry
    regression = _verdict(first, "hopper-fp8", "serving").floors[1]
    assert regression.status == "no_baseline" and regression.passed is None
    assert "no approved version" in regression.reason
    assert _verdict(first, "hopper-fp8", "serving").verdict == "pass"  # a first release is not blocked
    _publish(first, tmp_path, registry, e1)

    # a second gate of the same evaluation: every floor compared with the approved version
    second = _gate(e1, policy, repo_root, registry=registry)
    served = _verdict(second, "hopper-fp8", "serving")
    assert served.baseline is not None and served.baseline.version == "1"
    assert served.baseline.registered_model == f"{second.model}.hopper-fp8"
    level, regression = served.floors
    assert level.before == level.estimate and level.delta == 0.0  # from the records it was published with
    assert regression.status == "pass" and regression.estimate == 0.0 and regression.mde is not None
    assert "paired" in regression.paired_with  # item by item, against the approved version's records
    assert served.verdict == "pass"
    text = render_markdown(second)
    assert "## Against what is serving" in text
    row = next(line for line in text.splitlines() if line.startswith("| hopper-fp8 | serving | v1 |"))
    assert "max_regression" in text and row.endswith("| pass |")
    # tenants it was not approved for have no baseline
    assert all(v.baseline is None for v in second.verdicts if v.tenant not in first.approvals[v.artifact])

    # deliberately worse: every traffic window's KL divergence 0.05 higher than what is served
    def worse(r):
        for s in r["samples"]:
            s["kld_mean"] += 0.05
        r["metrics"]["kld_mean"] += 0.05

    edit(e1 / "hopper-fp8" / "traffic.json", worse)
    third = _gate(e1, policy, repo_root, registry=registry)
    served = _verdict(third, "hopper-fp8", "serving")
    level, regression = served.floors
    assert level.status == "pass"  # still within the absolute floor
    assert regression.status == "fail" and regression.estimate == pytest.approx(0.05)
    assert regression.delta == pytest.approx(0.05) and "regression" in regression.reason
    assert served.verdict == "fail" and "hopper-fp8" not in [
        a for a, tenants in third.approvals.items() if "serving" in tenants
    ]
    # the other artifacts, unchanged, still pass against their approved versions
    assert _verdict(third, "rocm-cdna3-fp8", "serving").verdict == "pass"


def test_previous_report_directory_works_offline(e1, repo_root, policy, tmp_path):
    first = _gate(e1, policy, repo_root)
    assert first.baselines_from is None and all(v.baseline is None for v in first.verdicts)
    write_report_json(first, tmp_path / "R1", e1)
    again = _gate(e1, policy, repo_root, previous=tmp_path / "R1")
    served = _verdict(again, "hopper-fp8", "serving")
    assert again.baselines_from == f"--previous {tmp_path / 'R1' / 'report.json'}"
    assert served.baseline is not None and served.baseline.version is None
    # paired with the records beside that report: the same items, the same values, no change at all
    regression = served.floors[1]
    assert regression.status == "pass" and regression.estimate == 0.0 and "paired" in regression.paired_with


def test_another_profile_is_not_comparable(e1, repo_root, policy, tmp_path):
    first = _gate(e1, policy, repo_root)
    write_report_json(first, tmp_path / "R1")
    edit(tmp_path / "R1" / "report.json", lambda r: r.update(profile="full"))
    again = _gate(e1, policy, repo_root, previous=tmp_path / "R1")
    regression = _verdict(again, "hopper-fp8", "serving").floors[1]
    assert regression.status == "insufficient_evidence" and "profile full" in regression.reason
    assert _verdict(again, "hopper-fp8", "serving").verdict == "fail"  # not advisory here


def test_an_unreachable_registry_is_transient_not_a_pass(e1, repo_root, policy, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    cfg = RegistryConfig(tracking_uri=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(RegistryUnavailableError) as err:
        _gate(e1, policy, repo_root, registry=cfg)
    assert err.value.exit_code == 75


@pytest.mark.heavy
def test_quantgate_gate_reads_the_registry_from_the_environment(e1, repo_root, policy, tmp_path):
    env = {"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{free_port()}", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
    args = [
        "gate",
        "--results",
        str(e1),
        "--gates",
        str(policy),
        "--root",
        str(repo_root),
        "--model-class",
        "draft",
    ]
    down = quantgate(*args, "--out", str(tmp_path / "R"), env=env, timeout=300)
    assert down.returncode == 75, down.stderr[-2000:]
    assert "registry" in down.stderr and not (tmp_path / "R" / "report.json").exists()
    # offline, with the previous report given by hand, the same command gates
    write_report_json(_gate(e1, policy, repo_root), tmp_path / "R1")
    offline = quantgate(
        *args, "--out", str(tmp_path / "R2"), "--previous", str(tmp_path / "R1"), env=env, timeout=300
    )
    assert offline.returncode == 0, offline.stderr[-2000:]
    report = json.loads((tmp_path / "R2" / "report.json").read_text())
    assert report["schema_version"] == 3 and report["baselines_from"].startswith("--previous ")


@pytest.mark.heavy
def test_a_version_of_this_very_build_is_no_baseline(e1, repo_root, policy, registry, tmp_path):
    """What a repeated run finds is what the first found (the flow's gate step stays cached)."""
    from quantgate.gate.baseline import from_registry

    first = _gate(e1, policy, repo_root)
    builds = {a: "ef" * 32 for a in first.approvals}  # the build key write_artifact records
    before = from_registry(registry, first.model, builds)
    _publish(first, tmp_path, registry, e1)
    after = from_registry(registry, first.model, builds)
    assert after == before and after.found == []
    # the flow learns its artifacts in the order their builds finish: any order, the same answer
    assert from_registry(registry, first.model, dict(reversed(builds.items()))) == before
    # a different build of the same targets is compared with them
    other = from_registry(registry, first.model, dict.fromkeys(first.approvals, "12" * 32))
    assert {(b.artifact, b.tenant) for b in other.found} == {
        (a, t) for a, tenants in first.approvals.items() for t in tenants
    }
