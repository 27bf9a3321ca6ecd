"""The registry end to end, as the pipeline and the fleet use it: a real ``mlflow server``
(SQLite backend, ``--no-serve-artifacts``) whose artifact store is S3 on loopback (moto), the
default model's FP8 artifact published and pulled through the command line, byte-identical."""

from __future__ import annotations

import filecmp
import json
from pathlib import Path

import pytest

from quantgate.contracts.artifact import MANIFEST, read_manifest
from quantgate.embedded.smollm2 import MODEL_NAME
from quantgate.publish import RegistryConfig, pull
from quantgate.publish.signing import generate_key_pair
from support.artifacts import write_report
from support.servers import TEST_CREDENTIALS, free_port, mlflow_server, moto_s3

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def registry_servers(tmp_path_factory):
    """(tracking URI, S3 endpoint): moto S3 plus mlflow server, both on 127.0.0.1."""
    db = tmp_path_factory.mktemp("mlflow-server") / "mlflow.db"
    with moto_s3() as s3, mlflow_server(f"sqlite:///{db}", f"s3://{s3.bucket}/mlflow", s3.url) as url:
        yield url, s3


def test_publish_then_pull_through_mlflow_server_and_s3_is_byte_identical(
    default_artifacts, registry_servers, run_cli, tmp_path
):
    out, _ = default_artifacts
    url, s3 = registry_servers
    public = generate_key_pair(tmp_path / "keys" / "pipeline.key")  # a server registry has no default key
    env = {
        **TEST_CREDENTIALS,
        "MLFLOW_TRACKING_URI": url,
        "MLFLOW_S3_ENDPOINT_URL": s3.url,
        "QUANTGATE_SIGNING_KEY": str(tmp_path / "keys" / "pipeline.key"),
        "QUANTGATE_TRUSTED_KEYS": str(public),
    }
    gate = write_report(tmp_path / "gate", {"hopper-fp8": ["chat"]}, model=MODEL_NAME).parent

    published = run_cli("publish", "--report", str(gate), "--artifacts", str(out), "--json", env=env)
    assert published.returncode == 0, published.stderr[-3000:]
    entry = json.loads(published.stdout)["artifacts"][0]
    assert entry["registered_model"] == f"{MODEL_NAME}.hopper-fp8" and entry["created"]
    assert entry["aliases"] == ["approved-chat"] and entry["source"].startswith(f"s3://{s3.bucket}/")

    cache = tmp_path / "node-cache"
    pulled = run_cli(
        "pull", MODEL_NAME, "--target", "hopper-fp8", "--tenant", "chat", "--cache-dir", str(cache), env=env
    )
    assert pulled.returncode == 0, pulled.stderr[-3000:]
    path = Path(pulled.stdout.strip())
    source = out / "hopper-fp8"
    names = sorted([*read_manifest(source).files, MANIFEST])
    assert sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()) == names
    assert all(filecmp.cmp(source / rel, path / rel, shallow=False) for rel in names)

    # publishing the same content again registers nothing new
    again = run_cli("publish", "--report", str(gate), "--artifacts", str(out), "--json", env=env)
    assert again.returncode == 0 and json.loads(again.stdout)["artifacts"][0]["created"] is False

    # a second pull is a cache hit: the S3 endpoint may as well be gone
    dead_s3 = RegistryConfig(
        tracking_uri=url, s3_endpoint_url=f"http://127.0.0.1:{free_port()}", trusted_keys=(public,)
    )
    assert pull(MODEL_NAME, "hopper-fp8", "chat", dead_s3, cache_dir=cache) == path

    # a tenant the gate did not approve is refused with exit code 2, and nothing is printed
    refused = run_cli(
        "pull", MODEL_NAME, "--target", "hopper-fp8", "--tenant", "code", "--cache-dir", str(cache), env=env
    )
    assert refused.returncode == 2 and refused.stdout == "" and "approved-code" in refused.stderr
