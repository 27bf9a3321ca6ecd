"""The fleet node's content-addressed cache of pulled artifacts, with a size limit.

An entry is named by its manifest's sha256 (the manifest holds every file's sha256, so that
names the files too). Why the manifest and not the files alone: hopper-fp8 and rocm-cdna3-fp8
are the same files under two manifests (each names its own target and numerics), and a cache
keyed by the files served the hopper-fp8 manifest to a rocm-cdna3-fp8 pull. The signed approval
names the manifest's sha256, so an entry is exactly what an approval approves.

Layout under ``<cache>/pull/``: ``<manifest-sha256>/`` is an installed artifact (its files and
``manifest.json``), present only once every file was verified, because it is renamed into
place whole; ``.records/<manifest-sha256>.json`` is its install record (the manifest's sha256,
its signature, and each file's size, mtime, ctime and inode as installed);
``.partial/<manifest-sha256>/`` is a pull in progress, whose verified files survive an
interruption (that is what makes pulls resumable); ``index.json`` remembers the last version
each (registry URI, registered model, alias or version) resolved to, with its signed approval,
for ``--offline``. Least recently used entries go first when the total passes the limit; an
entry's directory mtime is its last use. Entries of an older quantgate (named by the files'
content hash) have no matching name and are never served; the size limit evicts them.

Why records: an entry is served again and again, long after it was verified, from a disk that
anyone with root (or a ``--dest --link`` hard link) can write. ``problem`` checks an entry
against its manifest and record before it is served: by content (every file re-hashed against
the manifest's sha256) or, when the fleet chooses ``pull_verify: offline`` for online hits, by
each file's stat, whose ctime no write can leave unchanged.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from quantgate.contracts.artifact import MANIFEST, Manifest
from quantgate.runtime.atomic import install_dir, remove_dir, write_bytes, write_json
from quantgate.runtime.hashing import file_problem, per_file, sha256_file
from quantgate.runtime.safe_path import path_problem

ENTRY = re.compile(r"^[0-9a-f]{64}$")
RECORDS = ".records"


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _stat(path: Path) -> list[int]:
    st = os.lstat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


class PullCache:
    """The cache under one root, evicting least recently used entries past ``max_bytes``."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes

    def entry(self, entry_id: str) -> Path:
        """Where the installed entry ``entry_id`` (a manifest's sha256) is (or would be)."""
        if not ENTRY.match(entry_id):  # it becomes a directory name: never a path
            raise ValueError(f"not a manifest sha256: {entry_id!r}")
        return self.root / entry_id

    def record_path(self, entry_id: str) -> Path:
        """The install record of entry ``entry_id``."""
        return self.root / RECORDS / f"{self.entry(entry_id).name}.json"

    def staging(self, entry_id: str) -> Path:
        """The pull-in-progress directory of ``entry_id``, created if needed."""
        path = self.root / ".partial" / self.entry(entry_id).name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def discard_staging(self, entry_id: str) -> None:
        """Drop a pull in progress and what it downloaded (the disk is full: keep nothing)."""
        shutil.rmtree(self.root / ".partial" / self.entry(entry_id).name, ignore_errors=True)

    @contextlib.contextmanager
    def lock(self, entry_id: str) -> Iterator[None]:
        """One pull per content hash at a time on this node (two would share one staging dir)."""
        (self.root / ".partial").mkdir(parents=True, exist_ok=True)
        with open(self.root / ".partial" / f"{self.entry(entry_id).name}.lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def record(self, entry_id: str) -> dict | None:
        """The install record, or None when there is none (or it is unreadable)."""
        try:
            found = json.loads(self.record_path(entry_id).read_text())
        except (OSError, ValueError):
            return None
        return found if isinstance(found, dict) else None

    def problem(self, entry_id: str, rehash: bool) -> tuple[str, str] | None:
        """(file, why) when the installed entry is not what was installed, None when it is.

        Always: the install record is there, ``manifest.json`` has the sha256 it was installed
        with, which is the entry's name, every name is safe, and the entry
        holds exactly the manifest's files, regular files at their sizes. Then each file is
        re-hashed (``rehash``) or its stat compared with the record's (size, mtime, ctime, inode).
        """
        path = self.entry(entry_id)
        record = self.record(entry_id)
        if record is None or not isinstance(record.get("files"), dict):
            return MANIFEST, "has no install record (installed by an older quantgate, or damaged)"
        if record.get("manifest_sha256") != path.name:
            return MANIFEST, "is not the manifest this entry is named by"
        if sha256_file(path / MANIFEST).sha256 != record.get("manifest_sha256"):
            return MANIFEST, "differs from the manifest that was verified and installed"
        try:
            manifest = Manifest.model_validate_json((path / MANIFEST).read_text())
        except ValueError:
            return MANIFEST, "is not a valid manifest"
        for rel in manifest.files:
            if (why := path_problem(rel)) is not None:
                return rel, f"unsafe file name: {why}"
        present = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file() or p.is_symlink()}
        if extra := sorted(present - set(manifest.files) - {MANIFEST}):
            return extra[0], "is not in the manifest"
        rels = sorted(manifest.files)
        for rel in rels:
            file = path / rel
            if file.is_symlink() or not file.is_file():
                return rel, "missing, or not a regular file"
            if not rehash and _stat(file) != record["files"].get(rel):
                return rel, "changed on disk since it was verified (size, mtime, ctime or inode)"
        if rehash:  # shards on several cores (hashing.per_file)
            found = per_file(lambda rel: file_problem(path / rel, manifest.files[rel]), rels, "verify")
            for rel, why in zip(rels, found, strict=True):
                if why is not None:
                    return rel, why
        return None

    @staticmethod
    def touch(path: Path) -> None:
        """Mark an entry used now (its directory mtime orders eviction)."""
        now = time.time()
        os.utime(path, (now, now))

    def install(self, entry_id: str, staged: Path, extra: dict[str, str]) -> Path:
        """Record and rename a verified staging directory into place; enforce the size limit.

        ``extra``: what else the record keeps (the manifest's signature, the key that signed it).
        """
        target = self.entry(entry_id)
        for file in staged.rglob("*"):
            if file.is_file():
                file.chmod(0o444)
        manifest = Manifest.model_validate_json((staged / MANIFEST).read_text())
        record = {
            **extra,
            "manifest_sha256": sha256_file(staged / MANIFEST).sha256,
            "files": {rel: _stat(staged / rel) for rel in manifest.files},
        }
        write_json(self.record_path(entry_id), record, sort_keys=True)
        try:
            installed = install_dir(staged, target, replace=False)
        except BaseException:
            self.record_path(entry_id).unlink(missing_ok=True)
            raise
        if not installed:  # a leftover without a valid record: replace it with the verified copy
            remove_dir(target)
            install_dir(staged, target, replace=False)
        self.touch(target)
        self.evict(keep=entry_id)
        return target

    def remove(self, entry_id: str) -> None:
        """Drop an entry: gone from the cache at once, its bytes deleted next, its record too."""
        remove_dir(self.entry(entry_id))
        self.record_path(entry_id).unlink(missing_ok=True)
        self.torrent_path(entry_id).unlink(missing_ok=True)
        self.signature_path(entry_id).unlink(missing_ok=True)

    def torrent_path(self, entry_id: str) -> Path:
        """The entry's torrent (``quantgate.fleet``), beside its record: what ``quantgate seed`` serves."""
        return self.root / RECORDS / f"{self.entry(entry_id).name}.torrent"

    def signature_path(self, entry_id: str) -> Path:
        """Where a seeder puts the entry's manifest signature (from its record) for its peers."""
        return self.root / RECORDS / f"{self.entry(entry_id).name}.sig"

    def keep_torrent(self, entry_id: str, data: bytes) -> None:
        """Keep the torrent of an installed entry (its info-hash was checked against the signed one)."""
        write_bytes(self.torrent_path(entry_id), data)

    def entries(self) -> list[tuple[float, int, str]]:
        """(last use, bytes, content hash) of every installed entry, least recent first."""
        found = []
        if self.root.is_dir():
            for path in self.root.iterdir():
                if ENTRY.match(path.name) and (path / MANIFEST).exists():
                    found.append((path.stat().st_mtime, _tree_bytes(path), path.name))
        return sorted(found)

    def evict(self, keep: str, incoming: int = 0) -> list[str]:
        """Remove least recently used entries until the total (plus ``incoming`` bytes about to
        be downloaded) fits; never ``keep``."""
        entries = self.entries()
        total = sum(size for _, size, _ in entries) + incoming
        evicted = []
        for _, size, name in entries:
            if total <= self.max_bytes:
                break
            if name != keep:
                self.remove(name)
                total -= size
                evicted.append(name)
        return evicted

    # the resolution index, for --offline
    def remember(self, key: str, record: dict[str, str]) -> None:
        """Record what ``key`` (registry URI, registered model, alias or version) resolved to."""
        index = self.index()
        index[key] = record
        write_json(self.root / "index.json", index, sort_keys=True)

    def index(self) -> dict[str, dict[str, str]]:
        """Every remembered resolution; empty when there is none or the file is unreadable."""
        try:
            found = json.loads((self.root / "index.json").read_text())
        except (OSError, ValueError):
            return {}
        return found if isinstance(found, dict) else {}
