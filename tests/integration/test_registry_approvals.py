"""The gate's signed approval, end to end, as the pipeline and the fleet use it: a real ``mlflow
server`` (SQLite backend, ``--no-serve-artifacts``) whose artifact store is S3 on loopback (moto),
publish and pull through the command line, and someone with write access to the registry (but
not the signing key) moving ``approved-chat`` onto a version the gate failed, then onto another
model's signed artifact. Before the fix both pulls exited 0 with the artifact installed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from mlflow import MlflowClient

from quantgate.publish import naming
from quantgate.publish.signing import generate_key_pair
from support.artifacts import MODEL, installed_entries, write_artifact, write_report
from support.cli import quantgate
from support.servers import TEST_CREDENTIALS, mlflow_server, moto_s3

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """(environment of the pipeline and the fleet, tracking URI): moto S3 plus mlflow server."""
    base = tmp_path_factory.mktemp("approvals")
    public = generate_key_pair(base / "keys" / "pipeline.key")
    with (
        pytest.MonkeyPatch.context() as patch,
        moto_s3() as s3,
        mlflow_server(
            f"sqlite:///{base / 'mlflow.db'}", f"s3://{s3.bucket}/mlflow", s3.url, timeout_s=300
        ) as url,
    ):
        # MLflow's telemetry thread unsets an environment variable while this process's requests
        # read the environment (a KeyError inside an MlflowClient call, seen under load)
        patch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
        env = {
            **TEST_CREDENTIALS,
            "MLFLOW_TRACKING_URI": url,
            "MLFLOW_S3_ENDPOINT_URL": s3.url,
            "QUANTGATE_SIGNING_KEY": str(base / "keys" / "pipeline.key"),
            "QUANTGATE_TRUSTED_KEYS": str(public),
        }
        yield env, url


def _publish(env, tmp_path: Path, model: str, approvals: dict[str, list[str]]) -> dict[str, dict]:
    arts = tmp_path / f"arts-{model}"
    for target in approvals:
        write_artifact(
            arts / target, target, {"model.safetensors": os.urandom(200_000), "config.json": b"{}"}
        )
    report = write_report(tmp_path / f"gate-{model}", approvals, model=model)
    done = quantgate("publish", "--report", str(report.parent), "--artifacts", str(arts), "--json", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return {a["artifact"]: a for a in json.loads(done.stdout)["artifacts"]}


def _pull(env, target: str, cache: Path):
    return quantgate(
        "pull", MODEL, "--target", target, "--tenant", "chat", "--cache-dir", str(cache), env=env
    )


def _refused_in_one_line(done, *words: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr[-3000:])
    assert done.stdout == "" and "Traceback" not in done.stderr
    error = done.stderr.strip()
    assert error.count("\n") == 0 and error.startswith("error: ") and "Fix:" in error, error
    for word in words:
        assert word in error, error


def test_an_alias_moved_to_a_failed_version_or_another_models_artifact_is_refused(fleet, tmp_path):
    env, url = fleet
    ours = _publish(env, tmp_path, MODEL, {"hopper-fp8": ["chat"], "draft-int4": []})
    assert ours["draft-int4"]["aliases"] == []  # failed its gate: registered for audit only
    cache = tmp_path / "node-cache"
    good = _pull(env, "hopper-fp8", cache)
    assert good.returncode == 0, good.stderr[-3000:]

    client = MlflowClient(tracking_uri=url, registry_uri=url)
    draft = ours["draft-int4"]
    client.set_registered_model_alias(draft["registered_model"], "approved-chat", draft["version"])
    refused = _pull(env, "draft-int4", cache)
    # refused by the tenant's signed release record (issue 44), before the approval is read: no
    # record releases anything of draft-int4 (test_approval.py checks the approval behind it)
    _refused_in_one_line(refused, draft["registered_model"], "no signed release record for tenant 'chat'")

    # another model's signed, approved artifact registered as ours, tags and all
    theirs = _publish(env, tmp_path, "other-model", {"hopper-fp8": ["chat"]})["hopper-fp8"]
    source = client.get_model_version(theirs["registered_model"], theirs["version"])
    name = naming.registered_model_name(MODEL, "hopper-fp8")
    copy = client.create_model_version(name, source=source.source, run_id=source.run_id, tags=source.tags)
    client.set_registered_model_alias(name, "approved-chat", copy.version)
    refused = _pull(env, "hopper-fp8", tmp_path / "other-cache")
    _refused_in_one_line(refused, f"points at version {copy.version}", "releases version 1")
    assert installed_entries(tmp_path / "other-cache") == []
    assert len(installed_entries(cache)) == 1  # only the approved hopper-fp8 of the first pull
