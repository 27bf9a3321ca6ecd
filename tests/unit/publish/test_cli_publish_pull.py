"""``quantgate publish`` and ``quantgate pull`` as CI and a fleet node script them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from support.artifacts import MODEL
from support.cli import quantgate

pytestmark = [pytest.mark.unit, pytest.mark.heavy]


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return quantgate(*args, env=env)


def test_publish_json_then_pull_prints_only_the_path_and_refusals_exit_2(
    artifacts, report, registry, pull_cache
):
    env = {"MLFLOW_TRACKING_URI": registry.tracking_uri, "QUANTGATE_ARTIFACT_URI": registry.artifact_uri}
    published = _cli(
        "publish", "--report", str(report.parent), "--artifacts", str(artifacts), "--json", env=env
    )
    assert published.returncode == 0, published.stderr[-2000:]
    outcome = json.loads(published.stdout)
    hopper = next(a for a in outcome["artifacts"] if a["artifact"] == "hopper-fp8")
    assert hopper["aliases"] == ["approved-chat"]

    pulled = _cli(
        "pull", MODEL, "--target", "hopper-fp8", "--tenant", "chat", "--cache-dir", str(pull_cache), env=env
    )
    assert pulled.returncode == 0, pulled.stderr[-2000:]
    assert pulled.stdout.splitlines() == [str(pull_cache.resolve() / "pull" / hopper["manifest_sha256"])]
    assert Path(pulled.stdout.strip(), "model.safetensors").is_file()

    refused = _cli(
        "pull", MODEL, "--target", "hopper-fp8", "--tenant", "code", "--cache-dir", str(pull_cache), env=env
    )
    assert refused.returncode == 2 and refused.stdout == ""
    assert (
        "approved-code" in refused.stderr and "Fix:" in refused.stderr and "Traceback" not in refused.stderr
    )


def test_pull_dest_copies_unless_link_and_a_bad_verify_schedule_is_usage(
    artifacts, report, registry, pull_cache, tmp_path
):
    env = {"MLFLOW_TRACKING_URI": registry.tracking_uri, "QUANTGATE_ARTIFACT_URI": registry.artifact_uri}
    assert (
        _cli("publish", "--report", str(report.parent), "--artifacts", str(artifacts), env=env).returncode
        == 0
    )
    base = ("pull", MODEL, "--target", "hopper-fp8", "--tenant", "chat", "--cache-dir", str(pull_cache))
    copied = _cli(*base, "--dest", str(tmp_path / "copy"), "--verify", "offline", env=env)
    assert copied.returncode == 0, copied.stderr[-2000:]
    assert (tmp_path / "copy" / "model.safetensors").stat().st_nlink == 1
    linked = _cli(*base, "--dest", str(tmp_path / "linked"), "--link", env=env)
    assert linked.returncode == 0 and (tmp_path / "linked" / "model.safetensors").stat().st_nlink == 2
    bad = _cli(*base, "--verify", "sometimes", env=env)
    assert bad.returncode == 2 and "--verify" in bad.stderr and "Traceback" not in bad.stderr
