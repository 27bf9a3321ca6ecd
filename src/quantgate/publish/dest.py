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
out. What quantgate placed there is recorded in ``dest/.quantgate-pull.json`` (for a
destination pulled before the record existed: its manifest's files); every other file in
``dest`` is the operator's (a serving config, notes, a local override) and is carried into the
new tree, hard-linked, so pulling another version never deletes it. An operator's file with the
name of one of the new version's files is refused (exit 2) with nothing changed, rather than
overwritten. A directory that holds no pull of quantgate's is refused unless empty. A file
written into ``dest`` while the new tree is being swapped in may be lost.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

from quantgate.contracts.artifact import MANIFEST, read_manifest, verify_files
from quantgate.runtime.atomic import install_dir, staged_dir, write_json
from quantgate.runtime.errors import DestinationError
from quantgate.runtime.safe_path import path_problem

FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)
RECORD = ".quantgate-pull.json"  # what quantgate placed in a destination
_MAX_RECORD_BYTES = 16 * 1000 * 1000


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


def placed(dest: Path) -> set[str] | None:
    """The files quantgate placed in ``dest``: its record's, else (pulled before records) its
    manifest's files and the manifest; None when ``dest`` holds no pull of quantgate's."""
    try:
        with open(dest / RECORD, "rb") as fh:
            data = json.loads(fh.read(_MAX_RECORD_BYTES + 1) or b"null")
    except (OSError, ValueError, RecursionError):
        data = None
    names = data.get("placed") if isinstance(data, dict) else None
    if isinstance(names, list) and all(isinstance(n, str) and path_problem(n) is None for n in names):
        return set(names)
    manifest = read_manifest(dest)
    return None if manifest is None else {*manifest.files, MANIFEST}


def _theirs(dest: Path, ours: set[str]) -> list[str]:
    """Files (and symbolic links) in ``dest`` that quantgate did not place, sorted."""
    found = []
    for path in dest.rglob("*"):
        rel = path.relative_to(dest).as_posix()
        if (path.is_symlink() or path.is_file()) and rel not in ours and rel != RECORD:
            found.append(rel)
    return sorted(found)


def _clashes(theirs: list[str], entry: Path) -> list[str]:
    """The operator's files that the new tree would overwrite, or whose directory is one of its files."""
    names = {p.relative_to(entry).as_posix(): p.is_file() for p in entry.rglob("*")}
    return [
        rel
        for rel in theirs
        if rel in names or any(names.get(parent.as_posix()) for parent in Path(rel).parents)
    ]


def _carry(dest: Path, fresh: Path, rel: str) -> None:
    """The operator's ``dest/rel`` into the new tree: the same inode (a link), or a symlink as is."""
    source, target = dest / rel, fresh / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_symlink():
        os.symlink(os.readlink(source), target)
        return
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _record(directory: Path, entry: Path) -> None:
    manifest = read_manifest(entry)
    names = sorted({*(manifest.files if manifest else {}), MANIFEST})
    write_json(directory / RECORD, {"placed": names})


def materialize(entry: Path, dest: Path, link: bool = False) -> Path:
    """Put the cache entry ``entry``'s files at ``dest`` (copies; hard links with ``link``),
    keeping the operator's own files there; return it."""
    dest = Path(dest).absolute()
    theirs: list[str] = []
    if dest.exists() or dest.is_symlink():
        ours = placed(dest) if dest.is_dir() and not dest.is_symlink() else None
        empty = dest.is_dir() and not dest.is_symlink() and not any(dest.iterdir())
        if ours is None and not empty:
            raise DestinationError(
                dest,
                "exists and is not an artifact quantgate pulled",
                "pass a new or empty --dest; quantgate replaces only artifacts it pulled",
            )
        if ours is not None and _current(entry, dest, link):
            if not (dest / RECORD).is_file():
                _record(dest, entry)
            return dest  # the same content is already there, intact
        theirs = _theirs(dest, ours or set())
        if clash := _clashes(theirs, entry):
            raise DestinationError(
                dest / clash[0],
                "was not placed by quantgate, and the version being pulled has a file of that name",
                "move your file out of --dest (or rename it) and pull again; nothing was changed",
            )
    with staged_dir(dest) as fresh:
        shutil.copytree(
            entry, fresh, copy_function=_link_or_copy if link else _clone_or_copy, dirs_exist_ok=True
        )
        for rel in theirs:
            _carry(dest, fresh, rel)
        _record(fresh, entry)
        install_dir(fresh, dest)
    return dest
