"""Publish/pull fixtures: small synthetic artifacts with real manifests, a minimal gate report,
and a real SQLite MLflow registry with a local artifact store under tmp_path."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from quantgate.artifact import Manifest, hash_files, tool_versions, write_manifest
from quantgate.publish import RegistryConfig

MODEL = "tiny-model"


def write_artifact(directory: Path, target: str, files: dict[str, bytes]) -> Path:
    """An artifact directory as quantgate build lays it out: files plus a manifest of them."""
    directory.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        (directory / rel).parent.mkdir(parents=True, exist_ok=True)
        (directory / rel).write_bytes(data)
    manifest = Manifest(
        target=target,
        hardware="test",
        format="float-quantized",
        kv_cache="fp8_e4m3",
        numerics={"weights": "fp8_e4m3fn", "activations": "fp8_e4m3fn_per_token", "native_on": ["hopper"]},
        recipe={"name": "fp8-dynamic", "sha256": "ab" * 32, "engine": "model_free"},
        calibration=None,
        source={
            "content_hash": "cd" * 32,
            "architecture": "LlamaForCausalLM",
            "params": 1000,
            "model_class": "dense",
            "bytes": 2000,
        },
        tools=tool_versions(),
        build_key="ef" * 32,
        build={"seconds": 0.1, "peak_rss_bytes": 1, "finished_at": "2026-11-30T00:00:00+00:00"},
        files=hash_files(directory),
    )
    write_manifest(directory, manifest)
    return directory


def write_report(
    directory: Path, approvals: dict[str, list[str]], *, tenants=("chat", "code"), exit_code=0
) -> Path:
    """A minimal report.json of the shape quantgate gate writes (the gate is tested elsewhere)."""
    directory.mkdir(parents=True, exist_ok=True)
    verdicts = [
        {"artifact": a, "tenant": t, "verdict": "pass" if t in ok else "fail", "reasons": []}
        for a, ok in approvals.items()
        for t in tenants
    ]
    report = {
        "schema_version": 1,
        "model": MODEL,
        "model_class": "dense",
        "source_hash": "cd" * 32,
        "approvals": approvals,
        "verdicts": verdicts,
        "exit_code": exit_code,
        "metrics": {
            a: {"wikitext": {"perplexity": 10.5, "kld_mean": 0.01, "note": "text"}} for a in approvals
        },
    }
    (directory / "report.json").write_text(json.dumps(report))
    (directory / "report.md").write_text("# report\n")
    return directory / "report.json"


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
    from quantgate.publish.local_servers import moto_s3

    with moto_s3() as endpoint:
        yield endpoint


@pytest.fixture
def s3_registry(moto, tmp_path, monkeypatch, request) -> RegistryConfig:
    """SQLite MLflow in tmp_path whose artifact store is the moto S3 bucket."""
    from quantgate.publish.local_servers import TEST_CREDENTIALS

    for key, value in TEST_CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    return RegistryConfig.local(tmp_path / "registry").model_copy(
        update={
            "artifact_uri": f"s3://{moto.bucket}/{request.node.name}",
            "s3_endpoint_url": moto.url,
        }
    )
