"""Content hashing shared by every boundary: checkpoint intake, artifact manifests, pulls.

One definition of "a file by content" (``FileEntry``) and one way to hash a file, so that a
source's content hash, an artifact's manifest and a fleet node's verification can never
disagree about what was hashed.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from pydantic import Field, NonNegativeInt

from quantgate.frozen import FrozenRecord

CHUNK_BYTES = 8 * 1024 * 1024
T = TypeVar("T")


class FileEntry(FrozenRecord):
    """One file, by content."""

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    bytes: NonNegativeInt


def sha256_file(path: Path, on_chunk: Callable[[int], None] | None = None) -> FileEntry:
    """Hash a file in chunks; ``on_chunk(n)`` is called after each (for progress bars)."""
    digest = hashlib.sha256()
    read = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK_BYTES):
            digest.update(chunk)
            read += len(chunk)
            if on_chunk is not None:
                on_chunk(len(chunk))
    return FileEntry(sha256=digest.hexdigest(), bytes=read)


def per_file(fn: Callable[[str], T], rels: list[str], name: str) -> list[T]:
    """``[fn(rel) for rel in rels]`` on a thread per file, up to the core count (at most 8).

    Why threads: hashlib and torch's reductions release the GIL while they work on a chunk, so a
    multi-shard checkpoint is read on every core instead of one (and the disk sees several
    reads in flight); a single file still goes at one core's speed.
    """
    workers = min(len(rels), os.cpu_count() or 1, 8)
    if workers <= 1:
        return [fn(rel) for rel in rels]
    with ThreadPoolExecutor(workers, thread_name_prefix=name) as pool:
        return list(pool.map(fn, rels))


def sha256_files(
    root: Path, rels: list[str], on_chunk: Callable[[int], None] | None = None
) -> dict[str, FileEntry]:
    """``sha256_file`` of several files at once (``per_file``); ``on_chunk`` is called from the
    worker threads."""
    return dict(
        zip(rels, per_file(lambda rel: sha256_file(root / rel, on_chunk), rels, "sha256"), strict=True)
    )


def file_problem(path: Path, entry: FileEntry, against: str = "the manifest") -> str | None:
    """Why ``path`` is not the file ``entry`` describes (missing, size, then sha256), or None.
    The size is checked first: a stat, before reading a byte."""
    if not path.is_file():
        return "missing"
    size = path.stat().st_size
    if size != entry.bytes:
        return f"{size} bytes, {against} says {entry.bytes}"
    if sha256_file(path).sha256 != entry.sha256:
        return f"sha256 differs from {against}"
    return None


def content_hash(entries: dict[str, FileEntry]) -> str:
    """One hash over relative paths and file hashes: independent of where the files live,
    changed by any renamed, added, removed or altered file."""
    overall = hashlib.sha256()
    for rel in sorted(entries):
        overall.update(f"{rel}\0{entries[rel].sha256}\n".encode())
    return overall.hexdigest()
