"""The pull cache and --dest hold what was verified: tampering on the node is caught, by content."""

from __future__ import annotations

import json
import os

import pytest

from quantgate.contracts.artifact import hash_files
from quantgate.publish import pull
from quantgate.publish.dest import RECORD
from quantgate.runtime.errors import TamperedArtifactError, UsageError
from support.artifacts import MODEL

pytestmark = [pytest.mark.unit, pytest.mark.heavy]


def _placed(dest):
    """The artifact's files in a --dest, without the record of what quantgate placed there."""
    return {rel: entry for rel, entry in hash_files(dest).items() if rel != RECORD}


def _flip_keeping_stat(path, at=1000):
    """Flip one byte in place, same size, mtime put back (what bit rot or a careful hand leaves)."""
    st = path.stat()
    os.chmod(path, 0o644)
    with open(path, "r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)
        fh.seek(at)
        fh.write(bytes([byte[0] ^ 0xFF]))
    os.chmod(path, st.st_mode)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_same_size_byte_flip_in_the_cache_is_evicted_and_fetched_again_online(
    published, artifacts, registry, pull_cache
):
    path = pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)
    _flip_keeping_stat(path / "model.safetensors")
    again = pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)
    assert again == path
    assert hash_files(again) == hash_files(artifacts / "hopper-fp8")


def test_offline_a_tampered_entry_is_refused_naming_the_file_and_evicted(published, registry, pull_cache):
    path = pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)
    _flip_keeping_stat(path / "sub" / "tokenizer.json", at=0)
    with pytest.raises(TamperedArtifactError) as err:
        pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache, offline=True)
    message = str(err.value)
    assert err.value.exit_code == 2 and "\n" not in message
    assert message.startswith(f"{path / 'sub' / 'tokenizer.json'}: sha256 differs")
    assert not path.exists()  # evicted: the next online pull downloads it again
    assert pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache) == path


def test_a_file_added_to_a_cache_entry_is_refused(published, registry, pull_cache):
    path = pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)
    (path / "sitecustomize.py").write_text("import os\n")
    with pytest.raises(TamperedArtifactError, match="sitecustomize.py: is not in the manifest"):
        pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache, offline=True)


def test_verify_offline_schedule_catches_a_write_by_its_ctime_online(
    published, artifacts, registry, pull_cache
):
    """pull_verify: offline re-hashes only --offline pulls; an online hit compares stats, and a
    write changes ctime even when size and mtime are put back."""
    lazy = registry.model_copy(update={"pull_verify": "offline"})
    path = pull(MODEL, "hopper-fp8", "chat", lazy, cache_dir=pull_cache)
    assert pull(MODEL, "hopper-fp8", "chat", lazy, cache_dir=pull_cache) == path  # intact: a hit
    _flip_keeping_stat(path / "model.safetensors")
    assert pull(MODEL, "hopper-fp8", "chat", lazy, cache_dir=pull_cache) == path
    assert hash_files(path) == hash_files(artifacts / "hopper-fp8")


def test_a_hostile_cache_index_cannot_name_a_path(published, registry, pull_cache, tmp_path):
    pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)
    index = pull_cache / "pull" / "index.json"
    records = json.loads(index.read_text())
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "manifest.json").write_text("{}")
    for record in records.values():
        record["manifest_sha256"] = "../../victim"
    index.write_text(json.dumps(records))
    with pytest.raises(UsageError, match="no cached pull"):
        pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache, offline=True)
    assert (victim / "manifest.json").read_text() == "{}"


def test_dest_is_a_copy_by_default_so_an_edit_there_never_reaches_the_cache(
    published, artifacts, registry, pull_cache, tmp_path
):
    dest = tmp_path / "serving" / "model"
    assert pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache, dest=dest) == dest
    entry = pull_cache / "pull" / published.manifest_sha256
    assert all((dest / rel).stat().st_ino != (entry / rel).stat().st_ino for rel in _placed(dest))
    os.chmod(dest / "config.json", 0o644)
    (dest / "config.json").write_bytes(b'{"a": 2}')  # same size, edited in the destination
    assert hash_files(entry) == hash_files(artifacts / "hopper-fp8")
    # the next pull serves the cache's bytes and puts the destination right
    assert pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache, dest=dest) == dest
    assert _placed(dest) == hash_files(artifacts / "hopper-fp8")
    other = tmp_path / "other"
    assert _placed(
        pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache, dest=other)
    ) == hash_files(artifacts / "hopper-fp8")


def test_link_shares_inodes_and_an_edit_through_them_is_refused_offline(
    published, artifacts, registry, pull_cache, tmp_path
):
    dest = tmp_path / "serving" / "model"
    pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache, dest=dest, link=True)
    assert (dest / "model.safetensors").stat().st_nlink == 2
    os.chmod(dest / "config.json", 0o644)
    (dest / "config.json").write_bytes(b'{"a": 2}')  # writes the cache entry's inode too
    with pytest.raises(TamperedArtifactError, match="config.json"):
        pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache, offline=True)
    # online the entry is fetched again and the destination relinked to intact bytes
    pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache, dest=dest, link=True)
    assert _placed(dest) == hash_files(artifacts / "hopper-fp8")


def test_a_full_disk_during_pull_is_transient_and_leaves_nothing_partial(published, registry, tmp_path):
    from quantgate.runtime.errors import DiskFullError
    from support.tmpfs import files_under, small_tmpfs

    with small_tmpfs(tmp_path / "small-cache", size_kib=200) as cache:  # the artifact is ~300 kB
        with pytest.raises(DiskFullError) as err:
            pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=cache)
        assert err.value.exit_code == 75 and "\n" not in str(err.value)
        assert "no space left" in str(err.value).lower() or "full" in str(err.value).lower()
        left = files_under(cache)
        assert not [f for f in left if published.manifest_sha256 in f and not f.endswith(".lock")], left
        assert not [f for f in left if f.startswith("pull/.records")], left


def test_a_full_disk_at_dest_is_transient_and_leaves_no_partial_dest(
    published, registry, pull_cache, tmp_path
):
    from quantgate.runtime.errors import DiskFullError
    from support.tmpfs import files_under, small_tmpfs

    with small_tmpfs(tmp_path / "small-serving", size_kib=200) as serving:
        with pytest.raises(DiskFullError) as err:
            pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache, dest=serving / "model")
        assert err.value.exit_code == 75
        assert files_under(serving) == []
    # the cache entry itself is whole and serves the next pull
    assert pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache).is_dir()
