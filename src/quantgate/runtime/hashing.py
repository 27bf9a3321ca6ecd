"""Content hashing shared by every boundary: checkpoint intake, artifact manifests, pulls.

One definition of "a file by content" (``FileEntry``) and one way to hash a file, so that a
source's content hash, an artifact's manifest and a fleet node's verification can never
disagree about what was hashed.

A file's digest is versioned (``FileEntry.scheme``). ``sha256`` is the plain SHA-256 of the bytes,
what every record written before the scheme existed holds (a record without ``scheme`` means it).
``sha256-merkle-16k`` is BitTorrent v2's per-file root: SHA-256 over 16 KiB blocks, paired up to one
root (the tree the fleet's torrents verify), its subtrees on threads. ``blake3`` is BLAKE3's own
tree, on the ``blake3`` wheel's threads. Both spread one large file over every core, where sha256
runs on one (8B in one 16 GB shard took 14 s on an H200 worker); the source checkpoint is hashed
with the faster one by measurement (``SOURCE_SCHEME``). Verifying an entry always uses the entry's
own scheme, so records written with any of them keep verifying.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import Field, NonNegativeInt, SerializerFunctionWrapHandler, model_serializer

from quantgate.runtime.frozen import FrozenRecord

CHUNK_BYTES = 8 * 1024 * 1024
T = TypeVar("T")
Scheme = Literal["sha256", "sha256-merkle-16k", "blake3"]
# chosen by bench/build/hash_schemes.py (BENCHMARKS.md, issue 47): BLAKE3 hashed 2 GB at 1.0-1.1 GB/s
# on one core of the build machine, plain sha256 at 0.42 and the merkle (Python per block) at 0.34
SOURCE_SCHEME: Scheme = "blake3"
BLOCK = 16 * 1024  # BitTorrent v2's merkle leaf
# a subtree of this many bytes (a power-of-two count of blocks) is one thread's work
SUBTREE_BYTES = 8 * 1024 * 1024


class FileEntry(FrozenRecord):
    """One file, by content: ``sha256`` holds the 256-bit digest of ``scheme`` (SHA-256, its 16 KiB
    merkle root, or BLAKE3); the field keeps its first name so records written before schemes read."""

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    bytes: NonNegativeInt
    scheme: Scheme = "sha256"

    @model_serializer(mode="wrap")
    def _plain_without_scheme(self, handler: SerializerFunctionWrapHandler) -> Any:
        """A plain-sha256 entry is written as before the scheme existed, so manifests, stat caches
        and their hashes keep their bytes; only a new scheme is named."""
        out = handler(self)
        if isinstance(out, dict) and out.get("scheme") == "sha256":
            del out["scheme"]
        return out


def hash_file(
    path: Path, scheme: Scheme, on_chunk: Callable[[int], None] | None = None, workers: int | None = None
) -> FileEntry:
    """``path``'s entry in ``scheme`` (``workers`` threads for a merkle root: the core count, at most 8)."""
    if scheme == "sha256":
        return sha256_file(path, on_chunk)
    if scheme == "blake3":
        return blake3_file(path, on_chunk, workers)
    return merkle_file(path, on_chunk, workers)


def blake3_file(
    path: Path, on_chunk: Callable[[int], None] | None = None, workers: int | None = None
) -> FileEntry:
    """BLAKE3 of ``path`` (32 bytes), read in chunks that the ``blake3`` wheel hashes on
    ``workers`` threads (its tree splits each chunk; the GIL is released meanwhile)."""
    import blake3

    threads = workers or blake3.blake3.AUTO
    digest = blake3.blake3(max_threads=threads)
    read = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK_BYTES):
            digest.update(chunk)
            read += len(chunk)
            if on_chunk is not None:
                on_chunk(len(chunk))
    return FileEntry(sha256=digest.hexdigest(), bytes=read, scheme="blake3")


def _pair_up(layer: list[bytes], pad: bytes, width: int = 0) -> bytes:
    """The root over ``layer``, padded with ``pad`` to ``width`` leaves or the next power of two
    (BEP 52)."""
    size = 1
    while size < max(len(layer), width):
        size *= 2
    layer = layer + [pad] * (size - len(layer))
    while len(layer) > 1:
        layer = [hashlib.sha256(layer[i] + layer[i + 1]).digest() for i in range(0, len(layer), 2)]
    return layer[0]


def _pad_roots() -> list[bytes]:
    """The root of an all-zero subtree per height: height 0 is a zero leaf (BEP 52's padding)."""
    pads = [bytes(32)]
    for _ in range(40):
        pads.append(hashlib.sha256(pads[-1] + pads[-1]).digest())
    return pads


_PADS = _pad_roots()
_SUBTREE_BLOCKS = SUBTREE_BYTES // BLOCK


def _subtree(path: Path, start: int, width: int, on_chunk: Callable[[int], None] | None) -> bytes:
    """The root over the blocks of the ``SUBTREE_BYTES`` at ``start``, padded to ``width`` leaves:
    one read, one hashlib call per 16 KiB block (each releases the GIL)."""
    with open(path, "rb") as fh:
        fh.seek(start)
        data = fh.read(SUBTREE_BYTES)
    view = memoryview(data)
    leaves = [hashlib.sha256(view[i : i + BLOCK]).digest() for i in range(0, len(data), BLOCK)]
    if on_chunk is not None:
        on_chunk(len(data))
    return _pair_up(leaves, _PADS[0], width)


def merkle_file(
    path: Path, on_chunk: Callable[[int], None] | None = None, workers: int | None = None
) -> FileEntry:
    """BitTorrent v2's ``pieces root`` of ``path``: SHA-256 of each 16 KiB block (the last one
    short), paired up to a root with zero leaves as padding; an empty file's root is 32 zero bytes.
    Subtrees of ``SUBTREE_BYTES`` go to ``workers`` threads and are paired at the end."""
    size = path.stat().st_size
    starts = list(range(0, size, SUBTREE_BYTES))
    workers = min(workers or min(os.cpu_count() or 1, 8), max(len(starts), 1))
    if size == 0:
        root = bytes(32)
    elif len(starts) == 1:  # a file within one subtree: its tree is only as wide as its blocks need
        root = _subtree(path, 0, 0, on_chunk)
    else:
        with ThreadPoolExecutor(workers, thread_name_prefix="merkle") as pool:
            roots = list(pool.map(lambda s: _subtree(path, s, _SUBTREE_BLOCKS, on_chunk), starts))
        root = _pair_up(roots, _PADS[_SUBTREE_BLOCKS.bit_length() - 1])
    return FileEntry(sha256=root.hex(), bytes=size, scheme="sha256-merkle-16k")


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
    root: Path, rels: list[str], on_chunk: Callable[[int], None] | None = None, scheme: Scheme = "sha256"
) -> dict[str, FileEntry]:
    """``hash_file`` of several files at once (``per_file``); ``on_chunk`` is called from the
    worker threads. A merkle root of one file is itself spread over the cores, so the files then
    go one after another (threads of threads would only contend)."""
    if scheme == "sha256":
        hashed = per_file(lambda rel: sha256_file(root / rel, on_chunk), rels, "sha256")
    else:
        hashed = [hash_file(root / rel, scheme, on_chunk) for rel in rels]
    return dict(zip(rels, hashed, strict=True))


def file_problem(path: Path, entry: FileEntry, against: str = "the manifest") -> str | None:
    """Why ``path`` is not the file ``entry`` describes (missing, size, then sha256), or None.
    The size is checked first: a stat, before reading a byte."""
    if not path.is_file():
        return "missing"
    size = path.stat().st_size
    if size != entry.bytes:
        return f"{size} bytes, {against} says {entry.bytes}"
    if hash_file(path, entry.scheme).sha256 != entry.sha256:
        return f"{entry.scheme} differs from {against}"
    return None


def content_hash(entries: dict[str, FileEntry]) -> str:
    """One hash over relative paths and file hashes: independent of where the files live,
    changed by any renamed, added, removed or altered file. A non-plain scheme is named before its
    digest, so all-sha256 tables hash as they did before schemes existed, and one file's two
    digests can never stand for each other."""
    overall = hashlib.sha256()
    for rel in sorted(entries):
        entry = entries[rel]
        digest = entry.sha256 if entry.scheme == "sha256" else f"{entry.scheme}:{entry.sha256}"
        overall.update(f"{rel}\0{digest}\n".encode())
    return overall.hexdigest()
