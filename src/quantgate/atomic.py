"""Atomic writes and directory installs: a reader sees the old file or tree or the new one, never half.

Why: what quantgate writes for others to read (results, reports, calibration sets, artifacts,
pulled and converted checkpoints) must never be seen half-written. The helpers here write under
a temporary name beside the destination, on the same file system, so that one ``rename`` makes
it appear whole; a failure removes the temporary copy. Files: ``staged_file`` (and
``write_bytes``, ``write_text``, ``write_json``). Directories: ``staged_dir``, then ``install_dir``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def staged_file(path: Path, mode: int | None = None) -> Iterator[Path]:
    """A temporary file beside ``path`` to write; it replaces ``path`` when the block succeeds.

    On an exception the temporary file is removed and ``path`` keeps its old content.
    ``mode``: the file's permissions; None keeps ``mkstemp``'s private 0600.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` atomically, world-readable by default (results are shared)."""
    with staged_file(path, mode) as tmp:
        tmp.write_bytes(data)


def write_text(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` as UTF-8 to ``path`` atomically."""
    write_bytes(path, text.encode("utf-8"), mode)


def write_json(path: Path, payload: Any, *, indent: int = 1, **dump_kwargs: Any) -> None:
    """Write ``payload`` as JSON (one value per line at ``indent``, newline-terminated) atomically."""
    write_text(path, json.dumps(payload, indent=indent, **dump_kwargs) + "\n")


@contextlib.contextmanager
def staged_dir(final: Path) -> Iterator[Path]:
    """A new empty directory beside ``final`` to build a tree in, removed when the block exits.

    Beside, so that ``install_dir``'s rename stays on one file system; its name starts with a
    dot, so listings of the parent skip it. After ``install_dir`` there is nothing left to
    remove; after a failure the partial tree goes.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def install_dir(tmp: Path, final: Path, *, replace: bool = True) -> bool:
    """Rename the complete tree ``tmp`` to ``final``; True when ``tmp`` became ``final``.

    ``replace=True``: an older ``final`` is renamed aside first and deleted only after the new
    tree is in place, so ``final`` is never a mix of the two. ``replace=False`` (content-keyed
    destinations, where a concurrent writer produces the same tree): a ``final`` that another
    process installed first is kept and False returned, leaving ``tmp`` to the caller, who may
    check the winner.
    """
    tmp, final = Path(tmp), Path(final)
    if not replace:
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
            return False
        return True
    old = None
    if final.exists():
        old = _aside(final)
        os.rename(final, old)
    try:
        os.rename(tmp, final)
    except BaseException:
        if old is not None:
            os.rename(old, final)  # the older copy stays where it was
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return True


def remove_dir(path: Path) -> None:
    """Delete the tree ``path``: renamed aside first, so its name is gone at once, never half-deleted."""
    path = Path(path)
    trash = _aside(path)
    with contextlib.suppress(FileNotFoundError):
        os.rename(path, trash)
        shutil.rmtree(trash, ignore_errors=True)


def _aside(path: Path) -> Path:
    """A free name beside ``path`` to move it to before deleting it (a crashed run's leftover goes)."""
    aside = path.with_name(f".{path.name}.old-{os.getpid()}")
    shutil.rmtree(aside, ignore_errors=True)
    return aside
