"""A size-capped tmpfs for disk-full tests: the real ENOSPC of a real file system, no mocks.

Mounting needs root (or CAP_SYS_ADMIN), as in CI; where it is refused the test is skipped with
the reason, never passed.
"""

from __future__ import annotations

import contextlib
import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(directory: Path, size_kib: int) -> Iterator[Path]:
    """``directory`` as a tmpfs of ``size_kib`` KiB for the block; unmounted after."""
    directory.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0755", "tmpfs", str(directory)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a size-capped tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], capture_output=True, check=False)


def fill(directory: Path, name: str = "filler") -> Path:
    """Write ``directory/name`` until the file system is full; the file is kept, the disk stays full."""
    path = directory / name
    with open(path, "wb", buffering=0) as fh:
        chunk = b"\0" * 4096
        while True:
            try:
                fh.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    return path


def files_under(directory: Path) -> list[str]:
    """Every file below ``directory`` (hidden ones too), relative, sorted."""
    return sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if not p.is_dir())
