"""A checkpoint URI from a push: a local path as is, s3:// downloaded once (a real moto S3 server)."""

from __future__ import annotations

import filecmp

import pytest

from quantgate.orchestrate.checkpoint_uri import local_checkpoint
from quantgate.runtime.errors import InputError
from support.servers import TEST_CREDENTIALS, moto_s3

pytestmark = [pytest.mark.unit, pytest.mark.heavy]


@pytest.fixture
def s3(monkeypatch):
    with moto_s3(bucket="training-checkpoints") as endpoint:
        for key, value in {**TEST_CREDENTIALS, "MLFLOW_S3_ENDPOINT_URL": endpoint.url}.items():
            monkeypatch.setenv(key, value)
        yield endpoint


def _push(s3, checkpoint, prefix):
    client = s3.client()
    for path in sorted(p for p in checkpoint.rglob("*") if p.is_file()):
        client.upload_file(str(path), s3.bucket, f"{prefix}/{path.relative_to(checkpoint).as_posix()}")


def test_an_s3_checkpoint_is_downloaded_once_into_the_cache(s3, tiny_llama, tmp_path):
    _push(s3, tiny_llama, "smol/step-100")
    local = local_checkpoint(f"s3://{s3.bucket}/smol/step-100/", tmp_path / "cache")
    assert local.parent == tmp_path / "cache" / "checkpoints"
    names = sorted(p.name for p in tiny_llama.iterdir())
    assert sorted(p.name for p in local.iterdir()) == names
    assert not filecmp.dircmp(tiny_llama, local).diff_files
    stamps = {p.name: p.stat().st_mtime_ns for p in local.iterdir()}
    again = local_checkpoint(f"s3://{s3.bucket}/smol/step-100", tmp_path / "cache")
    assert again == local and {p.name: p.stat().st_mtime_ns for p in again.iterdir()} == stamps

    s3.client().put_object(Bucket=s3.bucket, Key="smol/step-100/config.json", Body=b'{"changed": true}')
    assert (
        local_checkpoint(f"s3://{s3.bucket}/smol/step-100", tmp_path / "cache") != local
    )  # a new push is new work


def test_an_empty_prefix_or_a_missing_directory_is_refused(s3, tmp_path):
    with pytest.raises(InputError, match="no objects under this prefix"):
        local_checkpoint(f"s3://{s3.bucket}/nothing-here", tmp_path / "cache")
    with pytest.raises(InputError, match="does not exist"):
        local_checkpoint(str(tmp_path / "missing"), tmp_path / "cache")
    with pytest.raises(InputError, match="unsupported"):
        local_checkpoint("gs://bucket/x", tmp_path / "cache")
    assert not (tmp_path / "cache" / "checkpoints").exists() or not any(
        (tmp_path / "cache" / "checkpoints").iterdir()
    )


@pytest.mark.parametrize("key", ["ckpt/../escaped.json", "ckpt//double.json", "ckpt/./dot.json"])
def test_an_object_name_that_is_not_a_safe_relative_path_is_refused_before_any_download(s3, tmp_path, key):
    client = s3.client()
    client.put_object(Bucket=s3.bucket, Key="ckpt/config.json", Body=b"{}")
    client.put_object(Bucket=s3.bucket, Key=key, Body=b"{}")
    with pytest.raises(InputError, match="file name") as err:
        local_checkpoint(f"s3://{s3.bucket}/ckpt", tmp_path / "cache")
    assert err.value.exit_code == 2 and key.split("/", 1)[1] in str(err.value)
    assert not list(tmp_path.rglob("*.json"))  # nothing downloaded, inside the cache or out of it
