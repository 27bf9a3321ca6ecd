"""``--dest``: place a pulled artifact where a serving engine expects it.

By default the files are copies that share no inode with the cache: an edit in the destination
(a tokenizer "fixed" by hand, a config rewritten by a deploy script) stays there and never
reaches the cache that every later pull is served from. Where the file system can, a copy is a
reflink (``FICLONE``: copy-on-write, instant, no second copy of the bytes until one is written);
elsewhere it is a byte copy. ``link=True`` (``--link``) asks for hard links into the cache
instead (instant on any file system, no second copy, safe from eviction, which only unlinks the
cache's names): then an edit through the destination *is* an edit of the cache entry, and the
next pull finds it by the cache's verification and refuses that entry.

The new tree is built beside ``dest`` and renamed into place; an older pull there is swapped
out. Anything else at ``dest`` is refused rather than overwritten.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

from quantgate.artifact import MANIFEST, read_manifest, verify_files
from quantgate.atomic import install_dir, staged_dir
from quantgate.errors import DestinationError

FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)


def _clone_or_copy(src: str, dst: str) -> None:
    """A reflink where the file system supports one, else a byte copy; mode and times kept."""
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        try:
            fcntl.ioctl(fout.fileno(), FICLONE, fin.fileno())
        except OSError:
            shutil.copyfileobj(fin, fout, 16 * 1024 * 1024)
    shutil.copystat(src, dst)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        _clone_or_copy(src, dst)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.stat().st_ino == b.stat().st_ino and a.stat().st_dev == b.stat().st_dev
    except OSError:
        return False


def _current(entry: Path, dest: Path, link: bool) -> bool:
    """Whether ``dest`` already holds exactly ``entry``'s files (linked, if links were asked for)."""
    existing = read_manifest(dest)
    if existing is None or (dest / MANIFEST).read_bytes() != (entry / MANIFEST).read_bytes():
        return False
    if link:  # the entry was verified just now: its own inodes are the same bytes
        return all(_same_file(dest / rel, entry / rel) for rel in [*existing.files, MANIFEST])
    return not verify_files(dest, existing) and not any(
        _same_file(dest / rel, entry / rel) for rel in existing.files
    )


def materialize(entry: Path, dest: Path, link: bool = False) -> Path:
    """Put the cache entry ``entry``'s files at ``dest`` (copies; hard links with ``link``); return it."""
    dest = Path(dest).absolute()
    if dest.exists() or dest.is_symlink():
        existing = read_manifest(dest) if dest.is_dir() and not dest.is_symlink() else None
        empty = dest.is_dir() and not dest.is_symlink() and not any(dest.iterdir())
        if existing is None and not empty:
            raise DestinationError(
                dest,
                "exists and is not an artifact quantgate pulled",
                "pass a new or empty --dest; quantgate replaces only artifacts it pulled",
            )
        if existing is not None and _current(entry, dest, link):
            return dest  # the same content is already there, intact
    with staged_dir(dest) as fresh:
        shutil.copytree(
            entry, fresh, copy_function=_link_or_copy if link else _clone_or_copy, dirs_exist_ok=True
        )
        install_dir(fresh, dest)
    return dest
