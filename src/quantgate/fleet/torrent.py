"""A version's BitTorrent v2 torrent: made at publish, trusted at pull only through its info-hash.

The torrent covers the artifact's files plus ``manifest.json`` and ``manifest.sig`` (so a node
can get the whole version from its peers when the origin is down), under a directory named by
the manifest's sha256, which is the name of the node's cache entry. v2 only: every file is
hashed as a SHA-256 merkle tree of 16 KiB blocks, so a bad block is pinned on the peer that sent
it, and every file starts on a piece boundary, so a piece maps to one file. The v2 info-hash
(SHA-256 of the info dictionary) goes into the version's signed approval; the torrent itself is
stored beside the manifest (``manifest.torrent``) and, on nodes, beside the cache entry's install
record. Whatever carries it, a torrent whose info-hash is not the signed one is refused.

Only the signed part is used (``signed_part``): the info dictionary, whose SHA-256 is the signed
info-hash, and the piece layers, which are the merkle trees' middle layers and are checked by
libtorrent against each file's root in the info dictionary (a layer that does not hash to its
root is refused). Everything else a .torrent file may carry sits outside the info dictionary and
so outside the signature: ``announce`` and ``announce-list`` (trackers), ``url-list`` and
``httpseeds`` (web seeds), ``nodes`` (DHT), a comment of any size. A store able to add them made
every pulling node announce itself to a tracker of the writer's choosing and fetch from a web
seed, and kept a 60 MB comment beside each cache entry; they are dropped on every load, and the
re-encoded signed part is what libtorrent gets and what a node keeps to seed.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantgate.contracts.artifact import MANIFEST
from quantgate.runtime.safe_path import path_problem

TORRENT = "manifest.torrent"  # beside manifest.json in the store
MAX_TORRENT_BYTES = 64 * 1024 * 1024  # piece layers of a 2 TB artifact at 4 MiB pieces: 16 MB
MIN_PIECE = 1024 * 1024
MAX_PIECE = 16 * 1024 * 1024
TARGET_PIECES = 4096  # pieces small enough that many nodes fetch different ones at once


def piece_size(total_bytes: int) -> int:
    """A power of two between 1 and 16 MiB giving about ``TARGET_PIECES`` pieces."""
    size = MIN_PIECE
    while size < MAX_PIECE and total_bytes // size > TARGET_PIECES:
        size *= 2
    return size


def make(name: str, files: dict[str, Path]) -> bytes:
    """The bencoded v2 torrent of ``files`` (name in the torrent -> local file) under ``name``:
    the same bytes for the same files (no creation date), so two publishes of one version that
    write it to the same store path agree."""
    import libtorrent as lt

    with tempfile.TemporaryDirectory(prefix="quantgate-torrent-") as tmp:
        root = Path(tmp) / name
        storage = lt.file_storage()
        for rel in sorted(files):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(Path(files[rel]).resolve(), root / rel)
            storage.add_file(f"{name}/{rel}", Path(files[rel]).stat().st_size)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            creator = lt.create_torrent(storage, piece_size(storage.total_size()), lt.create_torrent.v2_only)
            creator.set_creation_date(0)  # none written: the same files make the same bytes, at any time
            lt.set_piece_hashes(creator, tmp)
        return lt.bencode(creator.generate())


@dataclass(frozen=True)
class Torrent:
    """A parsed torrent whose v2 info-hash was checked: its files (name -> index, bytes), and the
    bytes of its signed part (what a node keeps, ``signed_part``)."""

    info: Any  # libtorrent.torrent_info
    info_hash: str
    name: str
    files: dict[str, tuple[int, int]]
    data: bytes = b""


SIGNED_KEYS = (b"info", b"piece layers")


def signed_part(data: bytes) -> bytes:
    """The bencoded torrent of ``data``'s info dictionary and piece layers alone (see the module
    docstring); ValueError when ``data`` is not a bencoded dictionary with an info dictionary."""
    import libtorrent as lt

    decoded: Any = lt.bdecode(data)
    kept = {key: decoded[key] for key in SIGNED_KEYS if key in decoded} if isinstance(decoded, dict) else {}
    if b"info" not in kept or not isinstance(kept[b"info"], dict):
        raise ValueError("not a torrent (no info dictionary)")
    return bytes(lt.bencode(kept))


def info_hash(data: bytes) -> str:
    """The v2 info-hash (hex) of a bencoded torrent; ValueError when it is not a v2 torrent."""
    return str(_parse(signed_part(data)).info_hashes().v2)


def _parse(data: bytes):
    import libtorrent as lt

    try:
        info = lt.torrent_info(data)
    except RuntimeError as exc:
        raise ValueError(f"not a torrent ({exc})") from None
    if not info.info_hashes().has_v2():
        raise ValueError("not a BitTorrent v2 torrent")
    return info


def parsed(info, expected_hash: str, name: str, data: bytes = b"") -> Torrent:
    """``info`` (a ``torrent_info``, from bytes or from peers) as a ``Torrent``, once its v2
    info-hash is ``expected_hash`` and every file is a safe name under ``name``; ValueError
    saying why otherwise."""
    found = str(info.info_hashes().v2)
    if found != expected_hash:
        raise ValueError(f"has info-hash {found}, not the signed {expected_hash}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        layout = info.files()
    files = {}
    for index in range(layout.num_files()):
        if layout.file_flags(index) & 1:  # a pad file: no bytes of ours
            continue
        path = layout.file_path(index).replace(os.sep, "/")
        rel = path.removeprefix(f"{name}/")
        if rel == path or path_problem(rel) is not None:
            raise ValueError(f"names a file outside {name}/: {path!r}")
        files[rel] = (index, layout.file_size(index))
    if MANIFEST not in files:
        raise ValueError(f"does not hold {MANIFEST}")
    return Torrent(info, found, name, files, data)


def load(data: bytes, expected_hash: str, name: str) -> Torrent:
    """A bencoded torrent's signed part, checked as ``parsed`` does."""
    kept = signed_part(data)
    return parsed(_parse(kept), expected_hash, name, kept)
