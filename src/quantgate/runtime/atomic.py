"""Atomic writes and directory installs: a reader sees the old file or tree or the new one, never half.

Why: what quantgate writes for others to read (results, reports, calibration sets, artifacts,
pulled and converted checkpoints) must never be seen half-written. The helpers here write under
a temporary name beside the destination, on the same file system, so that one ``rename`` makes
it appear whole; a failure removes the temporary copy. Files: ``staged_file`` (and
``write_bytes``, ``write_text``, ``write_json``). Directories: ``staged_dir``, then ``install_dir``.

A process killed with SIGKILL runs no cleanup, so a temporary directory is named for its owner
(``.<name>.tmp-<pid>-<random>``) and locked (``flock``) while it is in use; ``remove_stale``, run
by ``staged_dir`` and by a build for each of its targets, deletes those whose lock is free and
whose process is gone. A full disk (ENOSPC, a quota) is a ``DiskFullError`` (exit 75) naming the
path, raised once the partial copy is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import json
import os
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from quantgate.runtime.errors import DiskFullError, TransientError

_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# how libraries with their own I/O (safetensors' Rust writer) spell ENOSPC and EDQUOT
_DISK_FULL_TEXT = ("no space left on device", "disk quota exceeded", "os error 28)", "os error 122)")
# a write that failed where fewer bytes than this are free is taken for a full disk: torch's zip
# writer reports ENOSPC as "RuntimeError: ... unexpected pos" with no errno anywhere
_NEARLY_FULL_BYTES = 1 << 20
# a temporary directory from before names carried their owner's pid: removed once unlocked and
# untouched this long (no process of this version locks it, so age is the only sign it is dead)
_LEGACY_STALE_SECONDS = 3600


def disk_full(exc: BaseException, where: Path) -> bool:
    """Whether ``exc`` is the file system under ``where`` running out of space.

    Yes when ENOSPC or EDQUOT is anywhere in its chain (an ``OSError``, or the text safetensors
    uses); or when the chain holds an I/O-shaped error (``OSError``, ``RuntimeError``) and the file
    system is full now. Call it before deleting the partial copy, which frees the space.
    """
    chain = _chain(exc)
    for e in chain:
        if isinstance(e, OSError) and e.errno in _DISK_FULL_ERRNOS:
            return True
        if any(text in str(e).lower() for text in _DISK_FULL_TEXT):
            return True
    return any(isinstance(e, OSError | RuntimeError) for e in chain) and _nearly_full(where)


def disk_full_error(path: Path, doing: str) -> DiskFullError:
    """The one-line ``DiskFullError`` for ``path``: what was being done, that nothing was kept, the fix."""
    return DiskFullError(
        f"{path}: no space left on device (ENOSPC) while {doing}; nothing half-written was kept. "
        "Fix: free space and re-run"
    )


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and all(e is not s for s in seen):
        seen.append(e)
        e = e.__cause__ or e.__context__
    return seen


def _nearly_full(where: Path) -> bool:
    where = Path(where)
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        st = os.statvfs(where)
    except OSError:
        return False
    free = st.f_bfree if os.geteuid() == 0 else st.f_bavail  # root may use the reserved blocks
    return free * st.f_frsize < _NEARLY_FULL_BYTES


def _is_disk_full(exc: BaseException, where: Path) -> bool:
    """True when ``exc`` should become a ``DiskFullError`` (decide before removing partial copies)."""
    return isinstance(exc, Exception) and not isinstance(exc, TransientError) and disk_full(exc, where)


@contextlib.contextmanager
def staged_file(path: Path, mode: int | None = None) -> Iterator[Path]:
    """A temporary file beside ``path`` to write; it replaces ``path`` when the block succeeds.

    On an exception the temporary file is removed and ``path`` keeps its old content; a full
    disk is raised as ``DiskFullError``. ``mode``: the file's permissions; None keeps
    ``mkstemp``'s private 0600.
    """
    path = Path(path)
    tmp: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        tmp = Path(name)
        yield tmp
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as exc:
        full = _is_disk_full(exc, path.parent)
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        if full:
            raise disk_full_error(path, "writing it") from exc
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
def staged_dir(final: Path, doing: str | None = None) -> Iterator[Path]:
    """A new empty directory beside ``final`` to build a tree in, removed when the block exits.

    Beside, so that ``install_dir``'s rename stays on one file system; its name starts with a
    dot, so listings of the parent skip it. It is named and locked for this process, and stale
    ones of ``final`` (their process killed) are removed first (``remove_stale``). After
    ``install_dir`` there is nothing left to remove; after a failure the partial tree goes, and a
    full disk is raised as ``DiskFullError`` naming ``final`` (``doing``: for its message).
    """
    final = Path(final)
    doing = doing or f"writing {final.name}"
    tmp: Path | None = None
    lock: int | None = None
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(final.parent, final.name)
        tmp, lock = _locked_tmp_dir(final)
        yield tmp
    except BaseException as exc:
        full = _is_disk_full(exc, final.parent)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if full:
            raise disk_full_error(final, doing) from exc
        raise
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if lock is not None:
            os.close(lock)  # the lock goes with the last descriptor; after a kill, with the process


def _locked_tmp_dir(final: Path) -> tuple[Path, int]:
    """``.<name>.tmp-<pid>-<random>`` beside ``final``, created 0700 and flock-ed; (path, fd)."""
    while True:
        tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            tmp.mkdir(mode=0o700)
            break
        except FileExistsError:
            continue
    fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # new and ours: nobody else can hold it
    return tmp, fd


def _stale_pattern(name: str) -> re.Pattern[str]:
    # ours: .NAME.tmp-PID-HEX, remove_dir's .NAME.trash-PID and install_dir's .NAME.old-PID; from
    # before names had pids: .NAME.tmp-XXXXXXXX (the build's mkdtemp), .NAME.XXXXXXXX.tmp (staged_dir's)
    n = re.escape(name)
    return re.compile(
        rf"^\.{n}\.(?:tmp-(?P<tmp>\d+)-[0-9a-f]+|trash-(?P<trash>\d+)|old-(?P<old>\d+)"
        rf"|(?P<legacy>tmp-[a-z0-9_]{{8}}|[a-z0-9_]{{8}}\.tmp))$"
    )


def remove_stale(parent: Path, name: str) -> list[Path]:
    """Delete temporary copies of ``parent/name`` left by killed processes; returns what went.

    A temporary directory whose lock is held, or whose owner (the pid in its name) still runs,
    is in use and kept; so is ``remove_dir``'s half-deleted tree. One without a pid (written
    before names had one) goes once unlocked and an hour old. A replaced tree that
    ``install_dir`` set aside (``.<name>.old-<pid>``, where it cannot exchange) goes only when
    ``name`` exists again: otherwise it may be the only copy, and it stays for a person.
    """
    pattern = _stale_pattern(Path(name).name)
    removed = []
    try:
        entries = list(os.scandir(parent))
    except (FileNotFoundError, NotADirectoryError):
        return []
    for entry in entries:
        match = pattern.match(entry.name)
        if match is None or not entry.is_dir(follow_symlinks=False):
            continue
        owner = match["tmp"] or match["trash"] or match["old"]
        if owner is not None and _alive(int(owner)):
            continue
        if match["old"] is not None and not (Path(parent) / name).exists():
            continue
        if match["legacy"] is not None and (
            time.time() - entry.stat(follow_symlinks=False).st_mtime < _LEGACY_STALE_SECONDS
        ):
            continue
        path = Path(entry.path)
        if _remove_unlocked(path):
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _remove_unlocked(path: Path) -> bool:
    """Delete ``path`` if nobody holds its lock (checked while holding it); False if in use."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False  # gone already (another cleaner), or not ours to open
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        shutil.rmtree(path, ignore_errors=True)
        return not path.exists()
    finally:
        os.close(fd)


def install_dir(tmp: Path, final: Path, *, replace: bool = True) -> bool:
    """Rename the complete tree ``tmp`` to ``final``; True when ``tmp`` became ``final``.

    ``replace=True``: an older ``final`` is exchanged with ``tmp`` in one ``renameat2`` call
    (``RENAME_EXCHANGE``: Linux; no moment without ``final``, even for a process killed here),
    then deleted from ``tmp``'s name; where the file system cannot exchange, it is renamed aside
    first and deleted only after the new tree is in place, so ``final`` is never a mix of the
    two. ``replace=False`` (content-keyed destinations, where a concurrent writer produces the
    same tree): a ``final`` that another process installed first is kept and False returned,
    leaving ``tmp`` to the caller, who may check the winner.
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
    if final.is_dir() and not final.is_symlink() and _exchange(tmp, final):
        shutil.rmtree(tmp, ignore_errors=True)  # the old tree, now under tmp's (locked) name
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


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


@functools.cache
def _renameat2() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # not glibc 2.28+ (or not Linux)
        return None


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names ``a`` and ``b`` atomically; False where not supported (then nothing moved)."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.ENOENT):
        return False  # no exchange here (old kernel, NFS...), or final just vanished: plain rename
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def remove_dir(path: Path) -> None:
    """Delete the tree ``path``: renamed aside first, so its name is gone at once, never half-deleted."""
    path = Path(path)
    trash = path.with_name(f".{path.name}.trash-{os.getpid()}")  # remove_stale's, should this process die
    shutil.rmtree(trash, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        os.rename(path, trash)
        shutil.rmtree(trash, ignore_errors=True)


def _aside(path: Path) -> Path:
    """A free name beside ``path`` to move it to before deleting it (a crashed run's leftover goes)."""
    aside = path.with_name(f".{path.name}.old-{os.getpid()}")
    shutil.rmtree(aside, ignore_errors=True)
    return aside
