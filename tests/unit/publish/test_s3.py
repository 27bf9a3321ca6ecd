"""The S3 path against a real moto server: checksums the store keeps, interrupted uploads."""

from __future__ import annotations

import os

import pytest
from mlflow import MlflowClient

from quantgate.contracts.artifact import hash_files
from quantgate.publish import RegistryConfig, naming, publish_report, pull, s3_store
from quantgate.publish.config import TransferSettings
from quantgate.runtime.errors import (
    RegistryRefusedError,
    RegistryUnavailableError,
    TamperedArtifactError,
    UnapprovedVersionError,
)
from quantgate.runtime.units import MB
from support.artifacts import MODEL, write_artifact, write_report
from support.servers import free_port

pytestmark = [pytest.mark.unit, pytest.mark.heavy]

# 6 MB parts: S3's smallest part is 5 MiB (5.24 MB), and s3transfer raises smaller ones to it
SMALL_PARTS = TransferSettings(concurrency=4, multipart_threshold_mb=6, multipart_chunksize_mb=6)


def test_digest_predicts_the_sha256_checksum_s3_keeps_for_single_and_multipart_objects(s3_registry, tmp_path):
    cfg = s3_registry.model_copy(update={"transfer": SMALL_PARTS})
    store = s3_store.S3Store(f"{cfg.artifact_uri}/objects", cfg)
    sizes = {"empty": 0, "small": 1000, "at-threshold": 6 * MB, "three-parts": 12 * MB + 7}
    files = {}
    for name, size in sizes.items():
        (tmp_path / name).write_bytes(os.urandom(size))
        files[name] = (tmp_path / name, store.digest(tmp_path / name))
    store.upload(files, lambda n: None)
    expected = {rel: digest for rel, (_, digest) in files.items()}
    assert store.verify(expected) == []
    # an object replaced in the store with other bytes of the same size is caught
    store.client.put_object(Bucket=store.bucket, Key=store.key("small"), Body=os.urandom(1000))
    assert store.verify(expected) == ["small: the store's SHA-256 checksum differs from the local file's"]


class _Faults:
    """Fault injection on a real boto3 client: fail every upload request after ``allow`` of them."""

    def __init__(self, allow: int) -> None:
        self.allow, self.sent = allow, 0

    def __call__(self, request, **kwargs):
        from botocore.exceptions import EndpointConnectionError

        if request.method == "PUT":
            self.sent += 1
            if self.sent > self.allow:
                raise EndpointConnectionError(endpoint_url=request.url)


REAL_MAKE_CLIENT = s3_store.make_client


def _with_faults(monkeypatch, faults: _Faults) -> None:
    def make_client(cfg: RegistryConfig):
        client = REAL_MAKE_CLIENT(cfg)
        client.meta.events.register("before-send.s3", faults)
        return client

    monkeypatch.setattr(s3_store, "make_client", make_client)


def test_interrupted_upload_leaves_no_version_or_alias_and_a_rerun_completes_it(
    s3_registry, tmp_path, monkeypatch, pull_cache
):
    artifacts = tmp_path / "artifacts"
    write_artifact(
        artifacts / "hopper-fp8",
        "hopper-fp8",
        {"a.safetensors": os.urandom(200_000), "b.safetensors": os.urandom(200_000), "config.json": b"{}"},
    )
    report = write_report(tmp_path / "gate", {"hopper-fp8": ["chat"]})
    cfg = s3_registry.model_copy(update={"transfer": TransferSettings(concurrency=1)})
    _with_faults(monkeypatch, _Faults(allow=2))
    with pytest.raises(RegistryUnavailableError, match="cannot be reached"):
        publish_report(report, artifacts, cfg)
    client = MlflowClient(tracking_uri=cfg.tracking_uri)
    name = f"{MODEL}.hopper-fp8"
    assert client.search_model_versions(f"name = '{name}'") == []
    assert client.get_registered_model(name).aliases == {}
    run = client.search_runs([client.get_experiment_by_name(naming.experiment_name(MODEL)).experiment_id])[0]
    assert run.data.tags[naming.UPLOAD] == "started" and run.info.status == "FAILED"
    with pytest.raises(UnapprovedVersionError):  # nothing a node could load
        pull(MODEL, "hopper-fp8", "chat", cfg, cache_dir=pull_cache)

    counting = _Faults(allow=10**6)
    _with_faults(monkeypatch, counting)
    outcome = publish_report(report, artifacts, cfg).artifacts[0]
    assert outcome.created and outcome.run_id == run.info.run_id and outcome.aliases == ["approved-chat"]
    # 3 files, report.json, report.md, manifest.json, manifest.sig, manifest.torrent: 2 were already there intact
    assert counting.sent == 8 - 2
    assert client.get_run(run.info.run_id).info.status == "FINISHED"
    path = pull(MODEL, "hopper-fp8", "chat", cfg, cache_dir=pull_cache)
    assert hash_files(path) == hash_files(artifacts / "hopper-fp8")


def test_an_object_altered_in_s3_is_caught_at_pull(s3_registry, tmp_path, moto, pull_cache):
    artifacts = tmp_path / "artifacts"
    write_artifact(artifacts / "hopper-fp8", "hopper-fp8", {"model.safetensors": os.urandom(100_000)})
    outcome = publish_report(
        write_report(tmp_path / "gate", {"hopper-fp8": ["chat"]}), artifacts, s3_registry
    ).artifacts[0]
    key = outcome.source.removeprefix(f"s3://{moto.bucket}/") + "/model.safetensors"
    moto.client().put_object(Bucket=moto.bucket, Key=key, Body=os.urandom(100_000))
    with pytest.raises(TamperedArtifactError, match="model.safetensors"):
        pull(MODEL, "hopper-fp8", "chat", s3_registry, cache_dir=pull_cache)
    assert not any(p.name == outcome.manifest_sha256 for p in (pull_cache / "pull").iterdir())


def test_a_hand_made_alias_on_an_unverified_version_is_never_pulled(s3_registry, tmp_path, pull_cache):
    artifacts = tmp_path / "artifacts"
    write_artifact(artifacts / "hopper-fp8", "hopper-fp8", {"model.safetensors": b"x" * 1000})
    outcome = publish_report(
        write_report(tmp_path / "gate", {"hopper-fp8": []}), artifacts, s3_registry
    ).artifacts[0]
    client = MlflowClient(tracking_uri=s3_registry.tracking_uri)
    partial = client.create_model_version(
        outcome.registered_model, outcome.source, tags={naming.CONTENT_HASH: "0" * 64}
    )
    client.set_registered_model_alias(outcome.registered_model, "approved-chat", partial.version)
    with pytest.raises(UnapprovedVersionError, match="no verified upload"):
        pull(MODEL, "hopper-fp8", "chat", s3_registry, cache_dir=pull_cache, allow_unapproved=True)


def test_a_missing_bucket_is_a_configuration_error_exit_2(s3_registry, tmp_path):
    artifacts = tmp_path / "artifacts"
    write_artifact(artifacts / "hopper-fp8", "hopper-fp8", {"model.safetensors": b"x" * 1000})
    cfg = s3_registry.model_copy(update={"artifact_uri": "s3://no-such-bucket/prefix"})
    with pytest.raises(RegistryRefusedError, match="NoSuchBucket") as err:
        publish_report(write_report(tmp_path / "gate", {"hopper-fp8": ["chat"]}), artifacts, cfg)
    assert err.value.exit_code == 2


def test_an_unreachable_tracking_server_is_transient_exit_75(tmp_path, monkeypatch, pull_cache):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    cfg = RegistryConfig(tracking_uri=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(RegistryUnavailableError, match="MLFLOW_TRACKING_URI") as err:
        pull(MODEL, "hopper-fp8", "chat", cfg, cache_dir=pull_cache)
    assert err.value.exit_code == 75
