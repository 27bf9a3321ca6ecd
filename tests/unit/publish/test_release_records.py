"""Signed release records (issue 44): an approval that cannot be replayed or frozen.

A real SQLite MLflow registry and a local store (conftest); the attacker is an ``MlflowClient``
with write access and no signing key, who saved the tags of an earlier state and puts them back.
The node is a pull cache directory; the operator runs ``quantgate release`` (the CLI, a fresh
interpreter, configured by the environment as a fleet node or a release job is).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import pytest
from mlflow import MlflowClient

from quantgate.contracts.artifact import read_manifest
from quantgate.publish import naming, publish_report, pull, release, withdraw_failed
from quantgate.publish.release import Ledger
from quantgate.runtime.errors import StaleReleaseError, UnapprovedVersionError
from support.artifacts import MODEL, installed_entries, write_artifact, write_report
from support.cli import quantgate

pytestmark = [pytest.mark.unit, pytest.mark.heavy]

NAME = f"{MODEL}.hopper-fp8"


def _client(cfg) -> MlflowClient:
    return MlflowClient(tracking_uri=cfg.tracking_uri, registry_uri=cfg.model_registry_uri)


def _env(cfg, tmp_path) -> dict[str, str]:
    """A node's (or a release job's) environment pointing at this registry."""
    (tmp_path / "project").mkdir(exist_ok=True)
    return {"MLFLOW_TRACKING_URI": cfg.tracking_uri, "HOME": str(tmp_path / "home")}


def _saved(cfg, version: str) -> tuple[dict[str, str], dict[str, str]]:
    """What an attacker saves before a withdrawal: the registered model's release tags and the
    version's approval tags."""
    client = _client(cfg)
    model_tags = {
        k: v for k, v in client.get_registered_model(NAME).tags.items() if k.startswith("quantgate.release")
    }
    version_tags = client.get_model_version(NAME, version).tags
    return model_tags, {k: version_tags[k] for k in (naming.APPROVAL, naming.APPROVAL_SIGNATURE)}


def _put_back(cfg, version: str, saved) -> None:
    """The replay: the saved tags and the alias, as they were."""
    client = _client(cfg)
    model_tags, version_tags = saved
    for key, value in model_tags.items():
        client.set_registered_model_tag(NAME, key, value)
    for key, value in version_tags.items():
        client.set_model_version_tag(NAME, version, key, value)
    client.set_registered_model_alias(NAME, "approved-chat", version)


def _withdraw(artifacts, cfg, tmp_path) -> None:
    failing = write_report(tmp_path / "gate-fail", {"hopper-fp8": []}, tenants=("chat",), exit_code=1)
    assert withdraw_failed(failing, artifacts, cfg) == {NAME: ["approved-chat"]}


def test_a_withdrawn_approval_put_back_with_its_alias_is_refused(
    published, artifacts, registry, pull_cache, tmp_path
):
    pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)  # the node serves version 1
    saved = _saved(registry, published.version)
    _withdraw(artifacts, registry, tmp_path)
    with pytest.raises(UnapprovedVersionError):  # the node hears of the withdrawal (an alias event)
        pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)
    _put_back(registry, published.version, saved)
    before = installed_entries(pull_cache)
    dest = tmp_path / "serving"
    run = quantgate(
        "pull", MODEL, "--target", "hopper-fp8", "--tenant", "chat", "--cache-dir", str(pull_cache),
        "--dest", str(dest), "--root", str(tmp_path / "project"), env=_env(registry, tmp_path),
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert run.stdout == "" and len(run.stderr.strip().splitlines()) == 1
    assert "older than record 2" in run.stderr and "replayed" in run.stderr
    assert not dest.exists() and installed_entries(pull_cache) == before


def test_a_replayed_record_is_refused_even_by_a_node_that_never_saw_the_withdrawal_once_expired(
    published, artifacts, registry, tmp_path
):
    """A node that never verified the newer record has only the expiry to go by (TUF's timestamp):
    here the replayed record was issued eight days ago, under the default seven-day expiry."""
    client = _client(registry)
    tags = dict(client.get_registered_model(NAME).tags)
    old = release.next_record(
        {},
        registry,
        registered_model=NAME,
        tenant="chat",
        event="approved",
        version=published.version,
        manifest_sha256=published.manifest_sha256,
        evidence_sha256="ab" * 32,
        now=datetime.now(UTC) - timedelta(days=8),
    )
    assert old.sequence == 1 == release.verified(*_record_tags(tags), "test", registry).sequence
    for key, value in release.sign(old, registry).items():  # as the pipeline signed it back then
        client.set_registered_model_tag(NAME, key, value)
    saved = _saved(registry, published.version)
    _withdraw(artifacts, registry, tmp_path)
    _put_back(registry, published.version, saved)
    with pytest.raises(StaleReleaseError, match="expired") as err:
        pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=tmp_path / "fresh-node")
    assert err.value.exit_code == 2 and installed_entries(tmp_path / "fresh-node") == []


def _record_tags(tags: dict[str, str]) -> tuple[str, str]:
    record, signature = release.tag_names("chat")
    return tags[record], tags[signature]


def _second_version(artifacts, registry, tmp_path):
    """Version 2 of hopper-fp8 (other bytes), approved for chat: the alias and record move to it."""
    arts = tmp_path / "arts-v2"
    write_artifact(
        arts / "hopper-fp8", "hopper-fp8", {"model.safetensors": os.urandom(2000), "config.json": b"{}"}
    )
    report = write_report(tmp_path / "gate-v2", {"hopper-fp8": ["chat"]})
    return publish_report(report, arts, registry).artifacts[0]


def test_an_operator_rollback_is_a_new_record_and_is_accepted(
    published, artifacts, registry, pull_cache, tmp_path
):
    v2 = _second_version(artifacts, registry, tmp_path)
    assert (
        read_manifest(pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)).files
        == read_manifest(artifacts.parent / "arts-v2" / "hopper-fp8").files
    )
    saved = _saved(registry, v2.version)  # record 2: version 2
    run = quantgate(
        "release", MODEL, "--target", "hopper-fp8", "--tenant", "chat", "--version", published.version,
        "--reason", "version 2 regressed in production", "--root", str(tmp_path / "project"),
        env=_env(registry, tmp_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "release record 3 (rollback) releases version 1" in run.stdout
    path = pull(
        MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache
    )  # an older version, a newer record
    assert path.name == published.manifest_sha256
    # and the state it replaced, put back, is now the replay
    _put_back(registry, v2.version, saved)
    with pytest.raises(StaleReleaseError, match="older than record 3"):
        pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)


def test_an_operator_cannot_release_a_version_the_gate_did_not_approve(published, registry, tmp_path):
    run = quantgate(
        "release", MODEL, "--target", "hopper-fp8", "--tenant", "code", "--version", published.version,
        "--reason", "try", "--root", str(tmp_path / "project"), env=_env(registry, tmp_path),
    )  # fmt: skip
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "did not approve version 1 for tenant 'code'" in run.stderr
    assert release.tag_names("code")[0] not in _client(registry).get_registered_model(NAME).tags


def test_a_renewal_is_a_new_record_with_a_fresh_expiry(published, registry, pull_cache, tmp_path):
    pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)
    run = quantgate(
        "release", MODEL, "--target", "hopper-fp8", "--tenant", "chat", "--renew",
        "--root", str(tmp_path / "project"), env=_env(registry, tmp_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "release record 2 (renewed) releases version 1" in run.stdout
    assert pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache).name == published.manifest_sha256


def test_an_offline_pull_refuses_a_resolution_a_newer_record_withdrew(
    published, artifacts, registry, pull_cache, tmp_path
):
    pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)
    _withdraw(artifacts, registry, tmp_path)
    with pytest.raises(UnapprovedVersionError):
        pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)
    with pytest.raises(StaleReleaseError, match="older than record 2") as err:
        pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache, offline=True)
    assert err.value.exit_code == 2


def _record(sequence: int, version: str | None, hours: float = 1.0) -> release.ReleaseRecord:
    now = datetime.now(UTC)
    return release.ReleaseRecord(
        registered_model=NAME,
        tenant="chat",
        sequence=sequence,
        event="approved" if version else "withdrawn",
        version=version,
        manifest_sha256="cd" * 32 if version else None,
        evidence_sha256="ab" * 32,
        issued_at=now,
        expires_at=now + timedelta(hours=hours),
    )


def test_the_ledger_keeps_the_highest_and_refuses_what_contradicts_it(tmp_path):
    ledger = Ledger(tmp_path, "sqlite:///r.db")
    ledger.admit(_record(2, "1"), "test")
    ledger.admit(_record(2, "1"), "test")  # the same state again (two publishes racing): accepted
    with pytest.raises(StaleReleaseError, match="older than record 2"):
        ledger.admit(_record(1, "1"), "test")
    with pytest.raises(StaleReleaseError, match="record 2 this node verified released version 1"):
        ledger.admit(_record(2, "7"), "test")  # one number, two states: refused
    with pytest.raises(StaleReleaseError, match="expired"):
        ledger.admit(_record(3, "1", hours=-1), "test")
    ledger.admit(_record(3, None), "test")
    assert ledger.highest(_record(1, "1")) == 3
    assert Ledger(tmp_path, "sqlite:///other.db").highest(_record(1, "1")) == 0  # per registry
