"""A registry for canary rollout tests: a real ``mlflow server`` whose store is S3 on loopback
(moto), signing keys, a project whose gates.yaml holds the tenants' rollout policies; and the
moves and checks the rollout tests share (publish a version, the aliases, the signed records)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from mlflow import MlflowClient

from quantgate.publish.signing import generate_key_pair
from support.artifacts import MODEL, write_artifact, write_report
from support.cli import quantgate
from support.servers import TEST_CREDENTIALS, mlflow_server, moto_s3

TARGET = "hopper-fp8"
NAME = f"{MODEL}.{TARGET}"


class RolloutRegistry(NamedTuple):
    """What a rollout test works against: the environment commands need, the project, the bucket."""

    env: dict[str, str]
    root: Path
    bucket: str


@contextlib.contextmanager
def rollout_registry(base: Path, gates: str) -> Iterator[RolloutRegistry]:
    """Moto S3, an mlflow server, keys, ``gates`` as the project's gates.yaml; the environment is
    also set in this process (MlflowClient, ``watch_once``)."""
    public = generate_key_pair(base / "keys" / "pipeline.key")
    (base / "project").mkdir()
    (base / "project" / "gates.yaml").write_text(gates)
    with (
        pytest.MonkeyPatch.context() as patch,
        moto_s3() as s3,
        mlflow_server(
            f"sqlite:///{base / 'mlflow.db'}", f"s3://{s3.bucket}/mlflow", s3.url, timeout_s=300
        ) as url,
    ):
        patch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
        env = {
            **TEST_CREDENTIALS,
            "MLFLOW_TRACKING_URI": url,
            "MLFLOW_S3_ENDPOINT_URL": s3.url,
            "QUANTGATE_SIGNING_KEY": str(base / "keys" / "pipeline.key"),
            "QUANTGATE_TRUSTED_KEYS": str(public),
        }
        for key, value in env.items():
            patch.setenv(key, value)
        yield RolloutRegistry(env, base / "project", s3.bucket)


def publish_version(
    env, root: Path, tmp: Path, n: int, tenants: tuple[str, ...] = ("chat",)
) -> tuple[str, bytes]:
    """Publish a new version of the artifact (random bytes) for ``tenants``; its version and weights."""
    weights = os.urandom(100_000)
    arts = tmp / f"arts-{n}"
    write_artifact(arts / TARGET, TARGET, {"model.safetensors": weights, "config.json": b"{}"})
    report = write_report(tmp / f"gate-{n}", {TARGET: list(tenants)})
    done = quantgate(
        "publish",
        "--report",
        str(report.parent),
        "--artifacts",
        str(arts),
        "--json",
        "--root",
        str(root),
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)["artifacts"][0]["version"], weights


def aliases() -> dict[str, str]:
    """The registered model's aliases, version numbers as strings."""
    return {a: str(v) for a, v in (MlflowClient().get_registered_model(NAME).aliases or {}).items()}


def records(channel: str, tenant: str = "chat") -> dict:
    """The tenant's signed release record of ``channel`` (stable, canary), as stored."""
    tags = MlflowClient().get_registered_model(NAME).tags
    return json.loads(tags[f"quantgate.release.{channel}.{tenant}"])
