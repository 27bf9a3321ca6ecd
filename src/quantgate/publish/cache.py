"""The fleet node's content-addressed cache of pulled artifacts, with a size limit.

Layout under ``<cache>/pull/``: ``<content-hash>/`` is an installed artifact (its files and
``manifest.json``), present only once every file was verified, because it is renamed into
place whole; ``.partial/<content-hash>/`` is a pull in progress, whose verified files survive
an interruption (that is what makes pulls resumable); ``index.json`` remembers the last
version each (registry URI, registered model, alias or version) resolved to, for ``--offline``.
Least recently used entries go first when the total passes the limit; an entry's directory
mtime is its last use.
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

from quantgate.artifact import MANIFEST, read_manifest
from quantgate.atomic import install_dir, remove_dir, write_json

_ENTRY = re.compile(r"^[0-9a-f]{64}$")


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class PullCache:
    """The cache under one root, evicting least recently used entries past ``max_bytes``."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes

    def entry(self, content_hash: str) -> Path:
        """Where the installed entry of ``content_hash`` is (or would be)."""
        return self.root / content_hash

    def staging(self, content_hash: str) -> Path:
        """The pull-in-progress directory of ``content_hash``, created if needed."""
        path = self.root / ".partial" / content_hash
        path.mkdir(parents=True, exist_ok=True)
        return path

    @contextlib.contextmanager
    def lock(self, content_hash: str) -> Iterator[None]:
        """One pull per content hash at a time on this node (two would share one staging dir)."""
        (self.root / ".partial").mkdir(parents=True, exist_ok=True)
        with open(self.root / ".partial" / f"{content_hash}.lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def lookup(self, content_hash: str) -> Path | None:
        """The installed entry, if whole: every manifest file there with its size (a stat per
        file, not a re-hash: entries are verified when installed and kept read-only)."""
        path = self.entry(content_hash)
        manifest = read_manifest(path) if path.is_dir() else None
        if manifest is None:
            return None
        for rel, entry in manifest.files.items():
            file = path / rel
            if not file.is_file() or file.stat().st_size != entry.bytes:
                self.remove(content_hash)  # damaged on disk: pull it again
                return None
        self.touch(path)
        return path

    @staticmethod
    def touch(path: Path) -> None:
        """Mark an entry used now (its directory mtime orders eviction)."""
        now = time.time()
        os.utime(path, (now, now))

    def install(self, content_hash: str, staged: Path) -> Path:
        """Rename a verified staging directory into place and enforce the size limit."""
        for file in staged.rglob("*"):
            if file.is_file():
                file.chmod(0o444)
        target = self.entry(content_hash)
        if not install_dir(staged, target, replace=False):  # installed meanwhile by another pull
            if read_manifest(target) is None:
                raise FileExistsError(f"{target} exists and is not a pulled artifact: remove it")
            shutil.rmtree(staged)
        self.touch(target)
        self.evict(keep=content_hash)
        return target

    def remove(self, content_hash: str) -> None:
        """Drop an entry: gone from the cache at once, its bytes deleted next."""
        remove_dir(self.entry(content_hash))

    def entries(self) -> list[tuple[float, int, str]]:
        """(last use, bytes, content hash) of every installed entry, least recent first."""
        found = []
        if self.root.is_dir():
            for path in self.root.iterdir():
                if _ENTRY.match(path.name) and (path / MANIFEST).exists():
                    found.append((path.stat().st_mtime, _tree_bytes(path), path.name))
        return sorted(found)

    def evict(self, keep: str) -> list[str]:
        """Remove least recently used entries until the total fits; never ``keep``."""
        entries = self.entries()
        total = sum(size for _, size, _ in entries)
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
            return json.loads((self.root / "index.json").read_text())
        except (OSError, ValueError):
            return {}
