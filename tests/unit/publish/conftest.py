"""Publish/pull fixtures: small artifacts with real manifests, a minimal gate report, and a real
SQLite MLflow registry with a local artifact store under tmp_path (builders: support.artifacts)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from quantgate.publish import RegistryConfig, publish_report
from support.artifacts import write_artifact, write_report
from support.servers import TEST_CREDENTIALS, moto_s3


@pytest.fixture
def artifacts(tmp_path) -> Path:
    out = tmp_path / "artifacts"
    write_artifact(
        out / "hopper-fp8",
        "hopper-fp8",
        {
            "model.safetensors": os.urandom(300_000),
            "config.json": b'{"a": 1}',
            "sub/tokenizer.json": b"{}",
        },
    )
    write_artifact(
        out / "draft-int4", "draft-int4", {"model.safetensors": os.urandom(100_000), "config.json": b"{}"}
    )
    return out


@pytest.fixture
def report(tmp_path) -> Path:
    return write_report(tmp_path / "gate", {"hopper-fp8": ["chat"], "draft-int4": []})


@pytest.fixture
def registry(tmp_path) -> RegistryConfig:
    """A real MLflow registry: SQLite and a local artifact directory, in tmp_path."""
    return RegistryConfig.local(tmp_path / "registry")


@pytest.fixture
def pull_cache(tmp_path) -> Path:
    return tmp_path / "node-cache"


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    """A real moto S3 server on loopback, shared by a module's tests (each uses its own prefix)."""
    with moto_s3() as endpoint:
        yield endpoint


@pytest.fixture
def s3_registry(moto, tmp_path, monkeypatch, request) -> RegistryConfig:
    """SQLite MLflow in tmp_path whose artifact store is the moto S3 bucket."""
    for key, value in TEST_CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    return RegistryConfig.local(tmp_path / "registry").model_copy(
        update={
            "artifact_uri": f"s3://{moto.bucket}/{request.node.name}",
            "s3_endpoint_url": moto.url,
        }
    )


@pytest.fixture
def published(artifacts, report, registry):
    """The hopper-fp8 entry of a publish: approved for 'chat' only."""
    return next(
        a for a in publish_report(report, artifacts, registry).artifacts if a.artifact == "hopper-fp8"
    )
