"""One check for every file name that comes from data rather than from the file system.

Why: names in a manifest, a cache index, a store listing or an S3 key are written by whoever
wrote that data, and ``root / name`` follows whatever they wrote: ``../x`` or ``/etc/x`` leaves
the root, and ``a//b``, ``./a`` or ``a/`` name the same file as ``a/b`` and ``a`` while hashing
and comparing as different names. Publish, pull and the checkpoint download all join such
names onto a directory, so they all go through ``safe_relpath`` first: a name is accepted only
in the one normalized spelling of a relative path that stays inside its root.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from quantgate.runtime.errors import UnsafePathError

_FIX = "file names must be relative paths inside the artifact, '/'-separated, without '.' or '..' parts"


def path_problem(name: str) -> str | None:
    """Why ``name`` is not a safe relative path, or None when it is one."""
    if not isinstance(name, str) or not name:
        return "is empty"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):  # NUL and every other control character
        return "contains a control character"
    if "\\" in name:
        return "contains a backslash"
    if name.startswith("/"):
        return "is absolute"
    parts = name.split("/")
    if ".." in parts:
        return "has a '..' part"
    if "" in parts or "." in parts:
        return "is not normalized (an empty or '.' part, or a trailing '/')"
    return None


def safe_relpath(name: str, what: str) -> PurePosixPath:
    """``name`` as a relative path that stays inside any root it is joined to.

    ``what`` says where the name came from (a manifest, an S3 key...), for the message. Refused
    (``UnsafePathError``, exit 2): empty, absolute, a ``..`` part, a backslash, NUL or another
    control character, and any spelling that is not the normalized one (``a//b``, ``./a``, ``a/``).
    """
    problem = path_problem(name)
    if problem is not None:
        raise UnsafePathError(what, f"file name {name!r} {problem}", _FIX)
    return PurePosixPath(name)
