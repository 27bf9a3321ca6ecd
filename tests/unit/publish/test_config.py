"""Where the registry is: defaults, the settings file, the environment, and the names."""

from __future__ import annotations

import pytest

from quantgate.publish import RegistryConfig, naming
from quantgate.runtime.errors import ConfigFileError, UsageError

pytestmark = pytest.mark.unit


def test_default_is_the_embedded_registry_under_artifacts_registry(tmp_path):
    cfg = RegistryConfig.from_env(tmp_path, environ={})
    assert cfg.tracking_uri == f"sqlite:///{tmp_path.resolve()}/artifacts_registry/mlflow.db"
    assert cfg.artifact_uri == (tmp_path.resolve() / "artifacts_registry" / "artifacts").as_uri()
    assert cfg.model_registry_uri == cfg.tracking_uri


def test_the_environment_points_at_a_server_and_an_s3_store(tmp_path):
    cfg = RegistryConfig.from_env(
        tmp_path,
        environ={
            "MLFLOW_TRACKING_URI": "http://mlflow:5000",
            "MLFLOW_S3_ENDPOINT_URL": "http://minio:9000",
            "QUANTGATE_PULL_CACHE_MAX_GB": "2.5",
            "QUANTGATE_TRANSFER_CONCURRENCY": "3",
        },
    )
    assert (cfg.tracking_uri, cfg.artifact_uri, cfg.s3_endpoint_url) == (
        "http://mlflow:5000",
        None,
        "http://minio:9000",
    )
    assert cfg.cache_max_bytes == 2_500_000_000 and cfg.transfer.concurrency == 3


def test_another_sqlite_registry_keeps_its_artifacts_beside_it_not_in_the_working_directory(tmp_path):
    cfg = RegistryConfig.from_env(tmp_path, environ={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/reg/m.db"})
    assert cfg.artifact_uri == (tmp_path / "reg" / "artifacts").as_uri()


def test_the_settings_file_is_read_and_a_typo_in_it_is_an_error(tmp_path):
    settings = tmp_path / "artifacts_registry" / "registry.yaml"
    settings.parent.mkdir()
    settings.write_text("version: 1\nartifact_uri: s3://bucket/prefix\npull_cache_max_gb: 1\n")
    cfg = RegistryConfig.from_env(tmp_path, environ={})
    assert cfg.tracking_uri.startswith("sqlite:///") and cfg.artifact_uri == "s3://bucket/prefix"
    assert cfg.cache_max_bytes == 10**9
    settings.write_text("version: 1\ntracking_url: http://x\n")
    with pytest.raises(ConfigFileError, match="tracking_url"):
        RegistryConfig.from_env(tmp_path, environ={})


def test_the_shipped_settings_file_is_valid(repo_root):
    assert RegistryConfig.from_env(repo_root, environ={}).tracking_uri.endswith(
        "artifacts_registry/mlflow.db"
    )


def test_names_the_fleet_relies_on():
    assert (
        naming.registered_model_name("smollm2-135m-instruct", "hopper-fp8")
        == "smollm2-135m-instruct.hopper-fp8"
    )
    assert naming.alias_for("chat") == "approved-chat"
    with pytest.raises(UsageError):
        naming.registered_model_name("a/b", "hopper-fp8")
    with pytest.raises(UsageError):
        naming.alias_for("chat room")


def test_transfer_part_sizes_are_si_megabytes(tmp_path):
    from quantgate.publish.config import TransferSettings
    from quantgate.publish.s3_store import S3Store

    transfer = TransferSettings(multipart_threshold_mb=16, multipart_chunksize_mb=7)
    store = S3Store("s3://bucket/prefix", RegistryConfig.local(tmp_path, transfer=transfer))
    assert (store.config.multipart_threshold, store.config.multipart_chunksize) == (16_000_000, 7_000_000)
