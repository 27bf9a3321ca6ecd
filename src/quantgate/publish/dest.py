"""``--dest``: place a pulled artifact where a serving engine expects it.

Files are hard links into the cache (instant, no second copy, and safe from eviction, which
only unlinks the cache's names), or copies across file systems. The new tree is built beside
``dest`` and renamed into place; an older pull there is swapped out. Anything else at
``dest`` is refused rather than overwritten.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from quantgate.artifact import read_manifest
from quantgate.atomic import install_dir, staged_dir
from quantgate.errors import DestinationError
from quantgate.hashing import content_hash


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def materialize(entry: Path, dest: Path) -> Path:
    """Put the cache entry ``entry``'s files at ``dest`` (links where possible); return ``dest``."""
    dest = Path(dest).absolute()
    if dest.exists() or dest.is_symlink():
        existing = read_manifest(dest) if dest.is_dir() else None
        empty = dest.is_dir() and not any(dest.iterdir())
        if existing is None and not empty:
            raise DestinationError(
                dest,
                "exists and is not an artifact quantgate pulled",
                "pass a new or empty --dest; quantgate replaces only artifacts it pulled",
            )
        if existing is not None and content_hash(existing.files) == entry.name:
            return dest  # the same content is already there
    with staged_dir(dest) as fresh:
        shutil.copytree(entry, fresh, copy_function=_link_or_copy, dirs_exist_ok=True)
        install_dir(fresh, dest)
    return dest
