"""Pulling from a real SQLite MLflow registry and a local store: verified, cached, refused."""

from __future__ import annotations

import json
import shutil

import pytest

from quantgate.contracts.artifact import MANIFEST, hash_files, read_manifest
from quantgate.publish import publish_report, pull
from quantgate.publish.dest import RECORD
from quantgate.publish.local_store import local_path
from quantgate.publish.signing import SIGNATURE
from quantgate.runtime.errors import (
    DestinationError,
    TamperedArtifactError,
    UnapprovedVersionError,
    UnknownModelError,
    UsageError,
)
from support.artifacts import MODEL, installed_entries, write_artifact, write_report

pytestmark = [pytest.mark.unit, pytest.mark.heavy]


def _placed(dest):
    """The artifact's files in a --dest, without the record of what quantgate placed there."""
    return {rel: entry for rel, entry in hash_files(dest).items() if rel != RECORD}


def test_pull_installs_a_byte_identical_verified_copy(published, artifacts, registry, pull_cache):
    path = pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)
    assert path == pull_cache / "pull" / published.manifest_sha256
    assert hash_files(path) == hash_files(artifacts / "hopper-fp8")
    assert read_manifest(path) == read_manifest(artifacts / "hopper-fp8")
    assert not any((pull_cache / "pull" / ".partial").rglob("*.safetensors"))


def test_second_pull_is_a_cache_hit_that_reads_no_store_bytes(published, registry, pull_cache):
    first = pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)
    shutil.rmtree(local_path(published.source))  # the store is gone: only the registry answers
    assert pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache) == first


def test_offline_pull_uses_the_last_resolution_and_needs_no_registry(
    published, registry, pull_cache, monkeypatch
):
    from quantgate.publish import tracking

    first = pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)

    def unreachable(cfg):  # fault injection: the registry is down
        raise AssertionError("offline pulls make no registry call")

    monkeypatch.setattr(tracking, "client", unreachable)
    assert pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache, offline=True) == first
    with pytest.raises(UsageError, match="no cached pull"):
        pull(MODEL, "draft-int4", "chat", registry, cache_dir=pull_cache, offline=True)


def test_a_file_altered_in_the_store_is_caught_and_nothing_installed(published, registry, pull_cache):
    stored = local_path(published.source) / "model.safetensors"
    data = bytearray(stored.read_bytes())
    data[1000] ^= 0xFF  # same size, one flipped byte
    stored.write_bytes(bytes(data))
    with pytest.raises(TamperedArtifactError, match="model.safetensors") as err:
        pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)
    assert err.value.exit_code == 2 and "sha256" in str(err.value)
    assert installed_entries(pull_cache) == []
    assert not (pull_cache / "pull" / ".partial" / published.manifest_sha256 / "model.safetensors").exists()


def test_a_manifest_swapped_in_the_store_to_match_altered_files_is_caught(published, registry, pull_cache):
    stored = local_path(published.source)
    (stored / "config.json").write_bytes(b'{"evil": true}')
    manifest = json.loads((stored / MANIFEST).read_text())
    manifest["files"] = {k: v.model_dump() for k, v in hash_files(stored).items()}
    (stored / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(TamperedArtifactError, match="manifest.json"):
        pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)
    assert installed_entries(pull_cache) == []


def test_a_file_missing_from_the_store_is_named(published, registry, pull_cache):
    (local_path(published.source) / "sub" / "tokenizer.json").unlink()
    with pytest.raises(TamperedArtifactError, match="sub/tokenizer.json"):
        pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)


def test_an_unapproved_tenant_or_version_is_refused_unless_allowed(
    published, registry, pull_cache, artifacts
):
    with pytest.raises(UnapprovedVersionError, match="approved-code") as err:
        pull(MODEL, "hopper-fp8", "code", registry, cache_dir=pull_cache)
    assert err.value.exit_code == 2
    with pytest.raises(UnapprovedVersionError, match="not approved"):
        pull(MODEL, "draft-int4", "chat", registry, cache_dir=pull_cache, version="1")
    with pytest.raises(UnapprovedVersionError):  # failed its gate: no alias for anyone
        pull(MODEL, "draft-int4", "chat", registry, cache_dir=pull_cache)
    assert installed_entries(pull_cache) == []
    path = pull(MODEL, "draft-int4", "chat", registry, cache_dir=pull_cache, allow_unapproved=True)
    assert hash_files(path) == hash_files(artifacts / "draft-int4")


def test_an_unknown_model_or_target_suggests_the_nearest(published, registry, pull_cache):
    with pytest.raises(UnknownModelError, match="did you mean 'tiny-model.hopper-fp8'"):
        pull(MODEL, "hoper-fp8", "chat", registry, cache_dir=pull_cache)


def test_an_interrupted_pull_resumes_keeping_verified_files(published, registry, pull_cache, monkeypatch):
    from quantgate.publish import local_store

    copied = []
    real_copy = local_store.copy_atomic

    def die_after_first_file(src, dst):  # fault injection: the node loses power mid-pull
        own = dst.name in (MANIFEST, SIGNATURE)
        if not own and copied:
            raise OSError("injected: interrupted")
        real_copy(src, dst)
        if not own:
            copied.append(dst)

    monkeypatch.setattr(local_store, "copy_atomic", die_after_first_file)
    with pytest.raises(OSError, match="injected"):
        pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)
    assert installed_entries(pull_cache) == [] and len(copied) == 1
    rel = copied[0].relative_to(pull_cache / "pull" / ".partial" / published.manifest_sha256)
    kept = copied[0].stat().st_ino
    monkeypatch.setattr(local_store, "copy_atomic", real_copy)
    path = pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)
    assert (path / rel).stat().st_ino == kept  # the verified file was kept, not downloaded again
    assert len(copied) == 1


def test_dest_with_link_gets_hard_links_and_refuses_a_foreign_directory(
    published, registry, pull_cache, tmp_path
):
    dest = tmp_path / "serving" / "model"
    got = pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache, dest=dest, link=True)
    assert got == dest and _placed(dest) == hash_files(pull_cache / "pull" / published.manifest_sha256)
    assert (dest / "model.safetensors").stat().st_nlink == 2
    assert pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache, dest=dest, link=True) == dest
    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(DestinationError):
        pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache, dest=foreign)
    assert (foreign / "notes.txt").read_text() == "mine"


def test_least_recently_used_entries_are_evicted_past_the_size_limit(registry, pull_cache, tmp_path):
    for i, tenant in enumerate(("a", "b", "c")):
        target = f"t{i}"
        write_artifact(tmp_path / "arts" / target, target, {"w.bin": bytes([i]) * 40_000})
        publish_report(
            write_report(tmp_path / f"gate-{i}", {target: [tenant]}, tenants=(tenant,)),
            tmp_path / "arts",
            registry,
        )
    small = registry.model_copy(update={"cache_max_bytes": 90_000})  # room for two entries
    first = pull(MODEL, "t0", "a", small, cache_dir=pull_cache)
    pull(MODEL, "t1", "b", small, cache_dir=pull_cache)
    pull(MODEL, "t0", "a", small, cache_dir=pull_cache)  # t0 used again: t1 is now least recent
    third = pull(MODEL, "t2", "c", small, cache_dir=pull_cache)
    assert set(installed_entries(pull_cache)) == {first.name, third.name}


def _with_source_files(tmp_path, source_tokenizer: bytes):
    """An artifact whose manifest records the source's tokenizer.json as ``source_tokenizer``."""
    import hashlib

    from quantgate.contracts.artifact import write_manifest

    artifact = write_artifact(
        tmp_path / "arts" / "hopper-fp8",
        "hopper-fp8",
        {"model.safetensors": b"\0" * 1000, "tokenizer.json": b'{"truncation": {"max_length": 512}}'},
    )
    recorded = {"tokenizer.json": hashlib.sha256(source_tokenizer).hexdigest()}
    write_manifest(artifact, read_manifest(artifact).model_copy(update={"source_files": recorded}))
    return artifact


def test_a_tokenizer_that_is_not_the_sources_is_refused(registry, pull_cache, tmp_path):
    """A re-saved tokenizer (here with a truncation the source did not have) hashed into the
    manifest's files is consistent with itself, but not with the build's record of the source."""
    _with_source_files(tmp_path, source_tokenizer=b'{"truncation": null}')
    publish_report(write_report(tmp_path / "gate", {"hopper-fp8": ["chat"]}), tmp_path / "arts", registry)
    with pytest.raises(TamperedArtifactError, match="tokenizer.json: is not the source's") as err:
        pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)
    assert err.value.exit_code == 2
    assert installed_entries(pull_cache) == []


def test_support_files_that_are_the_sources_pass(registry, pull_cache, tmp_path):
    artifact = _with_source_files(tmp_path, source_tokenizer=b'{"truncation": {"max_length": 512}}')
    publish_report(write_report(tmp_path / "gate", {"hopper-fp8": ["chat"]}), tmp_path / "arts", registry)
    path = pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)
    assert read_manifest(path).source_files == read_manifest(artifact).source_files
