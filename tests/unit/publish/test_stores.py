"""The store interface, for the stores that need no server: a local directory, and MLflow's own
artifact repository (the path ``mlflow-artifacts:`` and other schemes take), here on a file URI."""

from __future__ import annotations

import os

import pytest

from quantgate.publish import RegistryConfig
from quantgate.publish.local_store import LocalStore
from quantgate.publish.mlflow_store import MlflowStore

pytestmark = pytest.mark.unit


@pytest.fixture(params=["local", "mlflow"])
def store(request, tmp_path):
    uri = (tmp_path / "store").as_uri()
    return (
        LocalStore(uri)
        if request.param == "local"
        else MlflowStore(uri, RegistryConfig.local(tmp_path / "reg"))
    )


def test_upload_verify_download_and_tamper_detection(store, tmp_path):
    src = tmp_path / "src"
    (src / "artifact").mkdir(parents=True)
    files = {}
    for rel, data in {"artifact/w.safetensors": os.urandom(50_000), "artifact/config.json": b"{}"}.items():
        (src / rel).write_bytes(data)
        files[rel] = (src / rel, store.digest(src / rel))
    sent = []
    store.upload(files, sent.append)
    assert sum(sent) == 50_002
    expected = {rel: d for rel, (_, d) in files.items()}
    assert store.verify(expected) == []

    done = {}
    store.download(
        {rel: d.bytes for rel, d in expected.items()}, tmp_path / "dst", done.__setitem__, lambda n: None
    )
    assert {rel: p.read_bytes() for rel, p in done.items()} == {
        rel: p.read_bytes() for rel, (p, _) in files.items()
    }

    (tmp_path / "store" / "artifact" / "config.json").write_bytes(b"[]")
    problems = store.verify(expected)
    assert len(problems) == 1 and problems[0].startswith("artifact/config.json")


def test_a_cleanup_between_a_writers_creation_and_its_lock_leaves_the_copy_alone(tmp_path, monkeypatch):
    """Two publishes of one report copy the same files: one's ``remove_leftovers`` once ran in the
    other's window between creating its temporary file and locking it, took the unlocked file for a
    dead writer's, and unlinked it; the copy's rename then failed and that publish exited 1 (CI)."""
    import fcntl

    from quantgate.publish import local_store

    src = tmp_path / "model.safetensors"
    src.write_bytes(os.urandom(4096))
    dst = tmp_path / "store" / "model.safetensors"
    dst.parent.mkdir()
    real = fcntl.flock

    def another_publish_cleans_up_first(fd, operation):
        if operation == fcntl.LOCK_EX:  # the writer's own lock, not the cleanup's try (LOCK_NB)
            local_store.remove_leftovers(dst)
        return real(fd, operation)

    monkeypatch.setattr(local_store.fcntl, "flock", another_publish_cleans_up_first)
    local_store.copy_atomic(src, dst)
    assert dst.read_bytes() == src.read_bytes()
    assert [p.name for p in dst.parent.iterdir()] == ["model.safetensors"]
