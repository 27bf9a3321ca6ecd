"""The source's versioned content hash: the merkle scheme is BitTorrent v2's, stable and sensitive to
one byte; records written with plain sha256 (no scheme named) keep verifying."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings

import pytest

from quantgate.intake import confirm, intake
from quantgate.runtime.errors import CheckpointError
from quantgate.runtime.hashing import (
    SOURCE_SCHEME,
    FileEntry,
    blake3_file,
    content_hash,
    file_problem,
    hash_file,
    merkle_file,
    sha256_file,
)

pytestmark = pytest.mark.unit

MIB = 1024 * 1024
# empty, one byte, one block, a block and a byte, one subtree, past it, several uneven subtrees
SIZES = [0, 1, 16384, 16385, 8 * MIB, 8 * MIB + 1, 3 * 8 * MIB + 12345]


def _libtorrent_roots(directory, names):
    """Each file's ``pieces root`` as libtorrent's v2 torrent of ``directory`` records it."""
    import libtorrent as lt

    storage = lt.file_storage()
    for name in names:
        storage.add_file(f"{directory.name}/{name}", (directory / name).stat().st_size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        creator = lt.create_torrent(storage, MIB, lt.create_torrent.v2_only)
        lt.set_piece_hashes(creator, str(directory.parent))
        info = lt.torrent_info(lt.bdecode(lt.bencode(creator.generate())))
        files = info.files()
        return {
            files.file_path(i).split("/", 1)[1]: str(files.root(i))
            for i in range(files.num_files())
            if ".pad" not in files.file_path(i)
        }


def test_the_merkle_root_is_libtorrents_v2_root_on_any_thread_count(tmp_path):
    data = tmp_path / "files"
    data.mkdir()
    names = [f"f{size}" for size in SIZES]
    for name, size in zip(names, SIZES, strict=True):
        (data / name).write_bytes(os.urandom(size))
    theirs = _libtorrent_roots(data, names[1:])  # libtorrent gives an empty file no root
    for name in names[1:]:
        one, two = merkle_file(data / name, workers=1), merkle_file(data / name, workers=2)
        assert one == two
        assert one.sha256 == theirs[name], name
        assert one.scheme == "sha256-merkle-16k" and one.bytes == (data / name).stat().st_size
    assert merkle_file(data / "f0").sha256 == "0" * 64


def test_blake3_is_the_published_function_on_any_thread_count(tmp_path):
    import blake3

    path = tmp_path / "w.bin"
    path.write_bytes(os.urandom(3 * 8 * MIB + 5))  # several read chunks
    # BLAKE3's published test vector: the hash of no input
    (tmp_path / "empty").write_bytes(b"")
    empty = "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
    assert blake3_file(tmp_path / "empty").sha256 == empty
    whole = blake3.blake3(path.read_bytes()).hexdigest()
    assert blake3_file(path, workers=1).sha256 == blake3_file(path, workers=2).sha256 == whole


@pytest.mark.parametrize("scheme", ["sha256-merkle-16k", "blake3"])
def test_each_tree_hash_catches_one_changed_byte(tmp_path, scheme):
    path = tmp_path / "w.bin"
    path.write_bytes(os.urandom(2 * 8 * MIB + 100))
    entry = hash_file(path, scheme)
    assert hash_file(path, scheme) == entry  # stable
    assert file_problem(path, entry) is None
    with open(path, "r+b") as fh:
        fh.seek(9 * MIB + 7)
        byte = fh.read(1)
        fh.seek(9 * MIB + 7)
        fh.write(bytes([byte[0] ^ 1]))
    assert hash_file(path, scheme).sha256 != entry.sha256
    assert file_problem(path, entry) == f"{scheme} differs from the manifest"


def test_an_entry_written_before_schemes_reads_as_sha256_and_keeps_its_bytes(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"a": 1}')
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    old = FileEntry.model_validate({"sha256": digest, "bytes": path.stat().st_size})
    assert old.scheme == "sha256"
    assert old.model_dump() == {"sha256": digest, "bytes": 8}  # written as before: no new key
    assert file_problem(path, old) is None
    path.write_text('{"a": 2}')
    assert file_problem(path, old) == "sha256 differs from the manifest"
    # an all-sha256 table hashes exactly as before the scheme existed (old identity keys stand)
    before = hashlib.sha256(f"config.json\0{digest}\n".encode()).hexdigest()
    assert content_hash({"config.json": old}) == before
    # the same digest under the merkle scheme is another key: two schemes never stand for each other
    as_merkle = FileEntry(sha256=digest, bytes=8, scheme="sha256-merkle-16k")
    assert content_hash({"config.json": as_merkle}) != before
    assert FileEntry.model_validate(as_merkle.model_dump()) == as_merkle


def test_the_source_identity_changes_only_with_its_content(tiny_llama, policy, tmp_path):
    record = intake(tiny_llama, policy)
    assert {e.scheme for e in record.files.values()} == {SOURCE_SCHEME}
    elsewhere = shutil.copytree(tiny_llama, tmp_path / "elsewhere" / tiny_llama.name)
    assert intake(elsewhere, policy).content_hash == record.content_hash  # the path is no part of it
    assert intake(tiny_llama, policy).content_hash == record.content_hash  # stable
    config = json.loads((tiny_llama / "config.json").read_text())
    (tiny_llama / "config.json").write_text(json.dumps(config, indent=3))  # same model, other bytes
    assert intake(tiny_llama, policy).content_hash != record.content_hash


def test_a_record_hashed_with_plain_sha256_still_confirms(tiny_llama, policy):
    record = intake(tiny_llama, policy)
    files = {rel: sha256_file(tiny_llama / rel) for rel in record.files}
    old = record.model_copy(update={"files": files, "content_hash": content_hash(files)})
    # a record as an older quantgate wrote it: no scheme in its JSON
    assert "scheme" not in old.model_dump_json()
    assert confirm(type(record).model_validate_json(old.model_dump_json())) == old
    (tiny_llama / "config.json").write_text((tiny_llama / "config.json").read_text() + " ")
    with pytest.raises(CheckpointError, match=r"sha256 differs"):
        confirm(old)
