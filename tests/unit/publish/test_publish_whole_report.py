"""A report is published whole or not at all, and a stopped publish leaves no temporary file in the
store: against a real SQLite MLflow registry and a local store, through the library and the CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from quantgate.contracts.artifact import MANIFEST
from quantgate.publish import RegistryConfig, publish_report
from quantgate.runtime.errors import ArtifactAlteredError, InputError, ReportError
from support.artifacts import write_artifact, write_report

pytestmark = [pytest.mark.unit, pytest.mark.heavy]


def _registered(cfg) -> list[str]:
    client = MlflowClient(tracking_uri=cfg.tracking_uri, registry_uri=cfg.model_registry_uri)
    return sorted(m.name for m in client.search_registered_models())


@pytest.mark.parametrize(
    "approvals",
    [
        {"hopper-fp8": ["chat"], "bad name": ["chat"]},  # an artifact name the registry refuses
        {"hopper-fp8": ["chat"], "draft-int4": ["no tenant"]},  # a tenant that cannot be an alias
        {"hopper-fp8": ["chat"], "../draft-int4": ["chat"]},  # a name that leaves --artifacts
    ],
    ids=["artifact-name", "tenant-name", "path"],
)
def test_one_invalid_name_publishes_nothing_of_the_report(artifacts, registry, tmp_path, approvals):
    """Before the fix the valid hopper-fp8 was registered and aliased, then the publish exited 2.
    Each bad artifact is a valid build where the name points (so only its name is wrong)."""
    for name in approvals:
        if not (artifacts / name / MANIFEST).exists():
            write_artifact(artifacts / name, name, {"model.safetensors": b"\2" * 1000})
    report = write_report(tmp_path / "gate", approvals)
    with pytest.raises(InputError) as err:
        publish_report(report, artifacts, registry)
    assert _registered(registry) == []
    assert err.value.exit_code == 2 and "\n" not in str(err.value)
    assert str(err.value).startswith(str(report))
    assert not (tmp_path / "registry" / "artifacts").exists()


def test_a_second_artifact_altered_after_build_publishes_nothing(artifacts, report, registry):
    weights = artifacts / "draft-int4" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[10] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ArtifactAlteredError, match="draft-int4") as err:
        publish_report(report, artifacts, registry)
    assert err.value.exit_code == 2
    assert _registered(registry) == []


def test_an_artifact_gated_as_one_target_with_anothers_manifest_is_refused(registry, tmp_path):
    arts = tmp_path / "arts"
    write_artifact(arts / "rocm-cdna3-fp8", "hopper-fp8", {"model.safetensors": b"\1" * 1000})
    with pytest.raises(ReportError, match="manifest is for target 'hopper-fp8'") as err:
        publish_report(write_report(tmp_path / "gate", {"rocm-cdna3-fp8": ["chat"]}), arts, registry)
    assert str(err.value).startswith(str(arts / "rocm-cdna3-fp8" / MANIFEST))
    assert _registered(registry) == []


def _store_leftovers(registry_dir: Path) -> list[str]:
    """Temporary copies anywhere in the local store: ours (.<name>.part-...) or atomic's (.<name>.X.tmp)."""
    store = registry_dir / "artifacts"
    return sorted(
        p.relative_to(store).as_posix()
        for p in store.rglob(".*")
        if p.is_file() and (".part-" in p.name or p.name.endswith(".tmp"))
    )


def _start_publish(report: Path, arts: Path, registry_dir: Path) -> subprocess.Popen:
    cfg = RegistryConfig.local(registry_dir)
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": cfg.tracking_uri,
        "QUANTGATE_ARTIFACT_URI": cfg.artifact_uri,
    }
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "quantgate.cli",
            "publish",
            "--report",
            str(report.parent),
            "--artifacts",
            str(arts),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stop_mid_copy(proc: subprocess.Popen, registry_dir: Path, signum: int) -> tuple[int, str]:
    """Send ``signum`` once the publish is writing a temporary copy in the store."""
    deadline = time.monotonic() + 300
    while not _store_leftovers(registry_dir):
        assert proc.poll() is None, f"publish ended before copying: {proc.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline, "no copy seen"
        time.sleep(0.005)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=120)
    return proc.returncode, stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_publish_stopped_mid_copy_leaves_no_temporary_file_after_the_rerun(tmp_path, signum):
    """The attack round's 67 MB ``.tmp`` stayed in the version's store directory after the re-run.
    SIGTERM now removes it on the way out; SIGKILL's is removed by the re-run (its lock is free)."""
    arts = tmp_path / "arts"
    write_artifact(arts / "hopper-fp8", "hopper-fp8", {"model.safetensors": os.urandom(150 * 1000 * 1000)})
    report = write_report(tmp_path / "gate", {"hopper-fp8": ["chat"]})
    registry_dir = tmp_path / "registry"
    code, stderr = _stop_mid_copy(_start_publish(report, arts, registry_dir), registry_dir, signum)
    if signum == signal.SIGTERM:  # before the fix: killed at once (-15), its copy left in the store
        assert code == 143 and "Traceback" not in stderr, (code, stderr[-2000:])
        assert _store_leftovers(registry_dir) == []
    else:
        assert code == -signal.SIGKILL
    again = _start_publish(report, arts, registry_dir)
    _, err = again.communicate(timeout=600)
    assert again.returncode == 0, err[-3000:]
    assert _store_leftovers(registry_dir) == []
    versions = MlflowClient(
        tracking_uri=RegistryConfig.local(registry_dir).tracking_uri
    ).search_model_versions()
    assert [(v.name, str(v.version)) for v in versions] == [("tiny-model.hopper-fp8", "1")]
