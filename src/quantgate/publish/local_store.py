"""The embedded store: a directory on local disk (``file://`` or a plain path).

Writes go to a temporary name beside the target and are renamed into place, so a killed
publish leaves whole files or none; verification re-hashes the store's copy.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

from quantgate.atomic import staged_file
from quantgate.hashing import FileEntry, file_problem, sha256_file
from quantgate.publish.store import Digest, OnBytes, OnFile


def local_path(uri: str) -> Path:
    """The directory a ``file://`` URI or a plain path names."""
    parsed = urlparse(uri)
    return Path(url2pathname(parsed.path)) if parsed.scheme == "file" else Path(uri)


def copy_atomic(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst`` through a temporary file in ``dst``'s directory."""
    with staged_file(dst) as tmp:
        shutil.copyfile(src, tmp)


class LocalStore:
    """An ``ArtifactStore`` on a local directory; checksums are the files' own sha256."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.root = local_path(uri)

    def digest(self, path: Path) -> Digest:
        """The file's sha256 and size (a local store keeps no checksum of its own)."""
        entry = sha256_file(path)
        return Digest(entry.sha256, entry.bytes)

    def _intact(self, rel: str, digest: Digest) -> bool:
        return file_problem(self.root / rel, FileEntry(sha256=digest.sha256, bytes=digest.bytes)) is None

    def upload(self, files: dict[str, tuple[Path, Digest]], on_bytes: OnBytes) -> None:
        """Copy each file not already there intact, atomically."""
        for rel, (path, digest) in files.items():
            if not self._intact(rel, digest):
                copy_atomic(path, self.root / rel)
            on_bytes(digest.bytes)

    def verify(self, expected: dict[str, Digest]) -> list[str]:
        """Re-hash the store's copy of every file; one line per file that differs."""
        problems = []
        for rel, digest in expected.items():
            if problem := file_problem(
                self.root / rel, FileEntry(sha256=digest.sha256, bytes=digest.bytes), "the local file"
            ):
                problems.append(f"{rel}: {problem} (in {self.uri})")
        return problems

    def download(self, files: dict[str, int], dest: Path, on_file: OnFile, on_bytes: OnBytes) -> None:
        """Copy each file into ``dest`` atomically; FileNotFoundError(rel) for one not there."""
        for rel, size in files.items():
            source = self.root / rel
            if not source.is_file():
                raise FileNotFoundError(rel)
            copy_atomic(source, dest / rel)
            on_bytes(size)
            on_file(rel, dest / rel)
