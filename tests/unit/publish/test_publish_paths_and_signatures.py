"""Hostile names, signatures and two publishes at once, against a real SQLite MLflow registry."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from mlflow import MlflowClient

from quantgate.contracts.artifact import MANIFEST
from quantgate.fleet import TORRENT
from quantgate.publish import RegistryConfig, approval, naming, publish_report, pull, release
from quantgate.publish.local_store import local_path
from quantgate.publish.signing import SIGNATURE, generate_key_pair, sign, verify
from quantgate.runtime.errors import (
    ArtifactAlteredError,
    InputError,
    SignatureError,
    TamperedArtifactError,
)
from quantgate.runtime.hashing import FileEntry, content_hash, sha256_file
from support.artifacts import MODEL, installed_entries, write_artifact, write_report

pytestmark = [pytest.mark.unit, pytest.mark.heavy]


def _client(cfg) -> MlflowClient:
    return MlflowClient(tracking_uri=cfg.tracking_uri, registry_uri=cfg.model_registry_uri)


def _with_file_name(artifact, rel, entry_from="config.json"):
    """The manifest of ``artifact`` with one more file entry named ``rel`` (hand-written)."""
    manifest = json.loads((artifact / MANIFEST).read_text())
    manifest["files"][rel] = manifest["files"][entry_from]
    (artifact / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("rel", ["../secret.txt", "/etc/hostname", "sub//x", "./config.json"])
def test_publish_refuses_a_manifest_name_outside_the_artifact_before_any_registry_call(
    artifacts, report, registry, tmp_path, rel
):
    (tmp_path / "secret.txt").write_bytes(b'{"a": 1}')  # same bytes as config.json: hashes match
    _with_file_name(artifacts / "hopper-fp8", rel)
    with pytest.raises(InputError, match="file name") as err:  # UnsafePathError, or the manifest's own check
        publish_report(report, artifacts, registry)
    assert err.value.exit_code == 2 and "\n" not in str(err.value)
    assert str(err.value).startswith(str(artifacts / "hopper-fp8" / MANIFEST))
    assert _client(registry).search_registered_models() == []
    assert not (tmp_path / "registry" / "artifacts").exists()  # nothing uploaded anywhere


def test_publish_refuses_a_symlink_leaving_the_artifact(artifacts, report, registry, tmp_path):
    (tmp_path / "outside.json").write_bytes(b'{"a": 1}')
    config = artifacts / "hopper-fp8" / "config.json"
    config.unlink()
    config.symlink_to(tmp_path / "outside.json")
    with pytest.raises(ArtifactAlteredError, match="symbolic link"):
        publish_report(report, artifacts, registry)
    assert _client(registry).search_registered_models() == []


def test_every_version_is_signed_and_the_signature_is_beside_its_manifest(published, registry):
    stored = local_path(published.source)
    assert (stored / SIGNATURE).is_file() and json.loads((stored / SIGNATURE).read_text())["dsseEnvelope"]
    tags = _client(registry).get_model_version(published.registered_model, published.version).tags
    assert len(tags[naming.SIGNED_BY]) == 16
    assert (registry.signing_key.stat().st_mode & 0o777) == 0o600


def test_the_same_key_and_content_sign_to_the_same_bytes_on_every_publish(
    artifacts, report, registry, tmp_path
):
    """Deterministic ECDSA: a second registry publishing the same report with the same key
    stores the same manifest.sig and torrent, so concurrent publishes sharing a run agree."""
    first = next(
        a for a in publish_report(report, artifacts, registry).artifacts if a.artifact == "hopper-fp8"
    )
    again = RegistryConfig.local(tmp_path / "again").model_copy(
        update={"signing_key": registry.signing_key, "trusted_keys": registry.trusted_keys}
    )
    second = next(a for a in publish_report(report, artifacts, again).artifacts if a.artifact == "hopper-fp8")
    one, two = local_path(first.source), local_path(second.source)
    assert (one / SIGNATURE).read_bytes() == (two / SIGNATURE).read_bytes()
    assert (one / TORRENT).read_bytes() == (two / TORRENT).read_bytes()
    tags = [
        _client(cfg).get_model_version(a.registered_model, a.version).tags
        for cfg, a in ((registry, first), (again, second))
    ]
    assert tags[0][naming.TORRENT] == tags[1][naming.TORRENT]
    # another manifest signs differently, and each signature still verifies with the public key
    other = tmp_path / "other.json"
    other.write_bytes((one / MANIFEST).read_bytes() + b" ")
    assert sign(other, registry) != (one / SIGNATURE).read_bytes()
    assert verify(other, sign(other, registry), registry, str(other)) == tags[0][naming.SIGNED_BY]


def test_a_store_manifest_with_a_hostile_name_is_tampering_even_when_signed(
    published, registry, pull_cache, tmp_path
):
    """A registry and store both rewritten by someone holding the signing key (a compromised
    publisher): the names are still checked before any file is written."""
    stored = local_path(published.source)
    manifest = json.loads((stored / MANIFEST).read_text())
    manifest["files"]["../../../../escaped"] = manifest["files"].pop("config.json")
    (stored / MANIFEST).write_text(json.dumps(manifest))
    (stored / SIGNATURE).write_bytes(sign(stored / MANIFEST, registry))
    client = _client(registry)
    client.set_model_version_tag(
        published.registered_model,
        published.version,
        naming.MANIFEST_SHA256,
        sha256_file(stored / MANIFEST).sha256,
    )
    files = content_hash({rel: FileEntry(**entry) for rel, entry in manifest["files"].items()})
    client.set_model_version_tag(published.registered_model, published.version, naming.CONTENT_HASH, files)
    before = client.get_model_version(published.registered_model, published.version).tags[naming.APPROVAL]
    statement = approval.Approval.model_validate_json(before).model_copy(
        update={"manifest_sha256": sha256_file(stored / MANIFEST).sha256, "content_hash": files}
    )
    for key, value in approval.sign(statement, registry).items():  # the approval re-signed too
        client.set_model_version_tag(published.registered_model, published.version, key, value)
    release.issue(  # and the tenant's release record (issue 44)
        client,
        registry,
        published.registered_model,
        "chat",
        event="approved",
        version=published.version,
        manifest_sha256=statement.manifest_sha256,
        evidence_sha256="00" * 32,
    )
    with pytest.raises(TamperedArtifactError, match="manifest.json: is not a valid manifest") as err:
        pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)
    assert err.value.exit_code == 2
    assert installed_entries(pull_cache) == []
    assert not list(tmp_path.rglob("escaped"))


def test_an_unsigned_version_is_refused(published, registry, pull_cache):
    (local_path(published.source) / SIGNATURE).unlink()
    with pytest.raises(SignatureError, match="not signed") as err:
        pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)
    assert err.value.exit_code == 2 and "\n" not in str(err.value)
    assert installed_entries(pull_cache) == []


def test_a_manifest_signed_by_an_unknown_key_is_refused(published, registry, pull_cache, tmp_path):
    other = RegistryConfig.local(tmp_path / "elsewhere")  # another registry's own key pair
    stored = local_path(published.source)
    (stored / SIGNATURE).write_bytes(sign(stored / MANIFEST, other))
    with pytest.raises(SignatureError, match="does not trust"):
        pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)
    assert installed_entries(pull_cache) == []
    # trusting that key too (the fleet's list) makes the same bytes acceptable
    both = registry.model_copy(update={"trusted_keys": (*registry.trusted_keys, *other.trusted_keys)})
    assert pull(MODEL, "hopper-fp8", "chat", both, cache_dir=pull_cache).is_dir()


def test_no_trusted_keys_is_refused_and_a_removed_key_stops_serving_the_cache(
    published, registry, pull_cache, tmp_path
):
    untrusting = registry.model_copy(update={"trusted_keys": ()})
    with pytest.raises(SignatureError, match="no trusted keys"):
        pull(MODEL, "hopper-fp8", "chat", untrusting, cache_dir=pull_cache)
    pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)
    rotated = tmp_path / "rotated.key"
    new_pub = generate_key_pair(rotated)
    only_new = registry.model_copy(update={"trusted_keys": (new_pub,)})
    with pytest.raises(SignatureError, match="does not trust"):  # the remembered approval, first
        pull(MODEL, "hopper-fp8", "chat", only_new, cache_dir=pull_cache, offline=True)


def test_a_server_registry_without_keys_refuses_to_publish(artifacts, report, tmp_path):
    cfg = RegistryConfig.from_env(tmp_path, environ={"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"})
    assert cfg.signing_key is None and cfg.trusted_keys == ()
    with pytest.raises(SignatureError, match="QUANTGATE_SIGNING_KEY"):
        publish_report(report, artifacts, cfg)


def test_keys_from_the_environment(tmp_path):
    key = tmp_path / "k" / "pub.key"
    public = generate_key_pair(key)
    cfg = RegistryConfig.from_env(
        tmp_path,
        environ={
            "MLFLOW_TRACKING_URI": "http://mlflow:5000",
            "QUANTGATE_SIGNING_KEY": str(key),
            "QUANTGATE_TRUSTED_KEYS": f"{public}{os.pathsep}{tmp_path / 'other.pub'}",
            "QUANTGATE_PULL_VERIFY": "offline",
        },
    )
    assert cfg.signing_key == key and cfg.trusted_keys == (public, tmp_path / "other.pub")
    assert cfg.pull_verify == "offline" and not cfg.generate_signing_key


def test_two_concurrent_publishes_of_the_same_content_leave_one_version(tmp_path):
    write_artifact(tmp_path / "arts" / "hopper-fp8", "hopper-fp8", {"model.safetensors": os.urandom(200_000)})
    report = write_report(tmp_path / "gate", {"hopper-fp8": ["chat"]}).parent
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'reg' / 'mlflow.db'}"}
    cfg = RegistryConfig.from_env(tmp_path, environ=env)
    _client(cfg).search_registered_models()  # the database exists before the race
    args = [sys.executable, "-m", "quantgate.cli", "publish", "--report", str(report), "--artifacts"]
    procs = [
        subprocess.Popen(
            [*args, str(tmp_path / "arts"), "--json"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [(out[-2000:], err[-3000:]) for out, err in outs]
    versions = _client(cfg).search_model_versions(f"name = '{MODEL}.hopper-fp8'")
    assert len(versions) == 1
    reported = {json.loads(out)["artifacts"][0]["version"] for out, _ in outs}
    assert reported == {str(versions[0].version)}
    assert {
        a: str(v) for a, v in _client(cfg).get_registered_model(f"{MODEL}.hopper-fp8").aliases.items()
    } == {"approved-chat": str(versions[0].version)}
