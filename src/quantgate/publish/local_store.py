"""The embedded store: a directory on local disk (``file://`` or a plain path).

Writes go to a temporary name beside the target and are renamed into place, so a killed
publish leaves whole files or none; verification re-hashes the store's copy.

Why the temporary name carries the writer's pid and is locked while written
(``.<name>.part-<pid>-<hex>``, ``flock``): a publish stopped by SIGKILL (or by SIGTERM outside
``quantgate publish``, which turns SIGTERM into a clean exit) runs no cleanup, and its
half-copied file stayed in the version's store directory for good: the re-run saw the target
file missing, copied it again and never looked at the leftover (67 MB in the attack round).
Every copy now first removes the leftovers of the same file whose lock is free (their writer
is gone); a live writer's copy is locked and kept. Leftovers of ``atomic.staged_file``'s
unlocked names (``.<name>.<8 chars>.tmp``, written before) go once an hour old.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

from quantgate.publish.store import Digest, OnBytes, OnFile
from quantgate.runtime.atomic import disk_full, disk_full_error
from quantgate.runtime.hashing import FileEntry, file_problem, sha256_file

_LEGACY_STALE_S = 3600  # a temporary file from before pids, or a staging one (killed before its lock): removed once this old


def local_path(uri: str) -> Path:
    """The directory a ``file://`` URI or a plain path names."""
    parsed = urlparse(uri)
    return Path(url2pathname(parsed.path)) if parsed.scheme == "file" else Path(uri)


def _leftover(name: str) -> re.Pattern[str]:
    n = re.escape(name)
    return re.compile(
        rf"^\.{n}\.(?:part-(?P<pid>\d+)-[0-9a-f]{{8}}(?P<staging>\.new)?|(?P<legacy>[a-z0-9_]{{8}}\.tmp))$"
    )


def remove_leftovers(dst: Path) -> list[Path]:
    """Delete the temporary copies of ``dst`` that killed writers left beside it; what went."""
    pattern, removed = _leftover(dst.name), []
    try:
        entries = list(os.scandir(dst.parent))
    except (FileNotFoundError, NotADirectoryError):
        return []
    for entry in entries:
        match = pattern.match(entry.name)
        if match is None or not entry.is_file(follow_symlinks=False):
            continue
        path = Path(entry.path)
        if match["legacy"] is not None or match["staging"] is not None:
            if time.time() - entry.stat(follow_symlinks=False).st_mtime >= _LEGACY_STALE_S:
                path.unlink(missing_ok=True)
                removed.append(path)
            continue
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue  # removed meanwhile
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # its writer is alive
        else:
            path.unlink(missing_ok=True)
            removed.append(path)
        finally:
            os.close(fd)
    return removed


@contextlib.contextmanager
def _locked_part(dst: Path) -> Iterator[int]:
    """A new temporary file beside ``dst``, locked for this process: its descriptor. Removed on
    any exception (SIGTERM under ``quantgate publish`` is one); renamed onto ``dst`` by the caller."""
    tmp = dst.with_name(f".{dst.name}.part-{os.getpid()}-{secrets.token_hex(4)}")
    # created under a staging name and locked before it takes the name a remover looks for: between
    # the creation and the lock, another publish's ``remove_leftovers`` took the unlocked file for a
    # dead writer's and unlinked it, and this one's rename failed (two publishes of one report, CI)
    staging = tmp.with_name(f"{tmp.name}.new")
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(staging, tmp)
        yield fd
        os.replace(tmp, dst)
    except BaseException as exc:
        full = isinstance(exc, OSError) and disk_full(exc, dst.parent)
        tmp.unlink(missing_ok=True)
        staging.unlink(missing_ok=True)
        if full:
            raise disk_full_error(dst, "copying it") from exc
        raise
    finally:
        os.close(fd)


def copy_atomic(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst`` through a locked temporary file beside it, after removing the
    leftovers of killed copies of ``dst``."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(dst)
    with _locked_part(dst) as fd, open(src, "rb") as fin, os.fdopen(os.dup(fd), "wb") as fout:
        shutil.copyfileobj(fin, fout, 16 * 1024 * 1024)


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

    def size(self, rel: str) -> int | None:
        """The stored file's size in bytes; None when it is not there."""
        path = self.root / rel
        return path.stat().st_size if path.is_file() else None

    def upload(self, files: dict[str, tuple[Path, Digest]], on_bytes: OnBytes) -> None:
        """Copy each file not already there intact, atomically; leftovers of killed copies go."""
        for rel, (path, digest) in files.items():
            if self._intact(rel, digest):
                remove_leftovers(self.root / rel)
            else:
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

    def read_range(self, rel: str, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes of ``rel`` from ``offset`` (the fleet's origin reads)."""
        with open(self.root / rel, "rb") as fh:
            fh.seek(offset)
            data = fh.read(length)
        if len(data) != length:
            raise OSError(f"{self.root / rel}: {len(data)} bytes at {offset}, asked for {length}")
        return data

    def download(self, files: dict[str, int], dest: Path, on_file: OnFile, on_bytes: OnBytes) -> None:
        """Copy each file into ``dest`` atomically; FileNotFoundError(rel) for one not there."""
        for rel, size in files.items():
            source = self.root / rel
            if not source.is_file():
                raise FileNotFoundError(rel)
            copy_atomic(source, dest / rel)
            on_bytes(size)
            on_file(rel, dest / rel)
