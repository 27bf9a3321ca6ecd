"""The checkpoint as a tree of files: what is in it, what must never be, and its content hash.

These checks run first and read nothing but directory entries, because they guard against
checkpoints that are dangerous rather than merely broken: a symlink can make a harmless
looking directory hand out ``/etc/shadow`` or a file of another tenant; a pickle file runs
code when loaded; a ``.py`` file is remote code that ``trust_remote_code`` would import.
No entry is ever followed while walking: symlinks are resolved only to see where they point.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

from quantgate.runtime.errors import (
    CheckpointError,
    EmptyCheckpointError,
    PickleFileError,
    RemoteCodeError,
    SymlinkEscapeError,
)
from quantgate.runtime.hashing import SOURCE_SCHEME, FileEntry, Scheme, content_hash, sha256_files
from quantgate.runtime.progress import SILENT, Progress

PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt"})
CODE_SUFFIXES = frozenset({".py", ".pyc", ".pyw"})
# names tools read as files by pattern: a directory so named is refused
_FILE_SUFFIXES = (".safetensors", ".json")


def list_files(root: Path) -> list[str]:
    """Every file of the checkpoint (relative POSIX paths, sorted), after the symlink checks.

    ``root`` must be resolved. A symlink whose target resolves inside ``root`` is kept (a
    symlinked file counts as a file, hashed by its target's content; a symlinked directory
    is not descended, its target is already in the tree). One that points outside, at
    nothing, or round in a loop is refused. Anything that is neither a file nor a directory is
    refused too, since reading a FIFO or a device would hang or read forever; so are names that
    are not UTF-8 (they cannot be recorded or printed as they are) and directories named like
    the files tools look for by pattern (``*.safetensors``, ``*.json``).
    """
    if not root.is_dir():
        problem = "does not exist" if not root.exists() else "is not a directory"
        raise EmptyCheckpointError(
            root, f"checkpoint {problem}", "pass the directory that holds config.json and *.safetensors"
        )

    def walk_error(exc: OSError) -> None:
        raise CheckpointError(
            exc.filename, f"cannot read checkpoint directory ({exc.strerror})", "fix its permissions"
        )

    files: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=walk_error, followlinks=False):
        here = Path(dirpath)
        for name in (*dirnames, *filenames):
            entry = here / name
            _check_name(entry, name)
            try:
                mode = entry.lstat().st_mode
            except OSError as exc:  # removed or renamed while walking
                raise CheckpointError(
                    shown(entry), f"cannot read checkpoint entry ({exc.strerror})", "fix or remove it"
                ) from None
            if stat.S_ISLNK(mode):
                target = _check_symlink(root, entry)
                if target.is_file():
                    files.append(entry.relative_to(root).as_posix())
                elif name.endswith(_FILE_SUFFIXES):
                    _refuse_directory_named_like_a_file(entry, name)
            elif stat.S_ISREG(mode):
                files.append(entry.relative_to(root).as_posix())
            elif stat.S_ISDIR(mode):
                if name.endswith(_FILE_SUFFIXES):
                    _refuse_directory_named_like_a_file(entry, name)
            else:
                raise CheckpointError(
                    entry,
                    "not a regular file, directory or symlink",
                    "remove it from the checkpoint directory",
                )
    return sorted(files)


def shown(path: Path | str) -> str:
    """``path`` as text an error message can print: bytes that are not UTF-8 as ``\\xNN`` escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def excerpt(value: object, limit: int = 80, quote: bool = True) -> str:
    """A value read from the checkpoint (a token, a regex, an exception's message) as one short line
    for an error message: its repr (``quote=False``: its text), whitespace collapsed, cut at ``limit``."""
    text = repr(value) if quote else str(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_name(entry: Path, name: str) -> None:
    """Refuse a name that is not UTF-8: it cannot be hashed, recorded in JSON or printed as it is."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise CheckpointError(
            shown(entry),
            "file name is not valid UTF-8",
            "rename it with a UTF-8 name, or remove it from the checkpoint directory",
        ) from None


def _refuse_directory_named_like_a_file(entry: Path, name: str) -> None:
    """A directory named ``*.safetensors`` or ``*.json``: every tool that globs for weights or
    configs would try to read it as one."""
    raise CheckpointError(
        entry,
        f"a directory named like a {Path(name).suffix} file",
        "rename or remove the directory",
    )


def _check_symlink(root: Path, link: Path) -> Path:
    try:
        target = link.resolve(strict=False)
    except (RuntimeError, OSError):  # Python 3.11 raises RuntimeError on a loop, later versions OSError
        raise SymlinkEscapeError(
            link,
            "symlink loop (following it never reaches a file)",
            "remove the link, or point it at the file it stands for",
        ) from None
    if not target.is_relative_to(root):
        raise SymlinkEscapeError(
            link,
            f"symlink points outside the checkpoint directory (to {target})",
            "replace the link with a copy of the file, or make the checkpoint self-contained",
        )
    if not target.exists():
        raise SymlinkEscapeError(
            link,
            f"dangling symlink (its target {target} does not exist)",
            "remove the link or restore the file it points to",
        )
    return target


def refuse_pickles(root: Path, files: list[str]) -> None:
    """Refuse the first pickle file (``PICKLE_SUFFIXES``): loading one can run code."""
    for rel in files:
        if Path(rel).suffix.lower() in PICKLE_SUFFIXES:
            raise PickleFileError(
                root / rel,
                "pickle file in the checkpoint: loading it can run arbitrary code, so quantgate refuses it",
                "convert the weights to safetensors (e.g. save_pretrained(..., safe_serialization=True)) "
                "and delete the pickle files",
            )


def refuse_code(root: Path, files: list[str]) -> None:
    """Refuse the first Python file (``CODE_SUFFIXES``): remote code is never run."""
    for rel in files:
        if Path(rel).suffix.lower() in CODE_SUFFIXES:
            raise RemoteCodeError(
                root / rel,
                "Python file in the checkpoint: remote code is refused (it would run with trust_remote_code)",
                "use a model architecture that transformers supports natively and delete the .py files",
            )


class HashingStopped(Exception):
    """``hash_files`` was told to stop (the checkpoint was refused meanwhile)."""


def hash_files(
    root: Path,
    files: list[str],
    progress: Progress = SILENT,
    known: dict[str, FileEntry] | None = None,
    stop: threading.Event | None = None,
    scheme: Scheme = SOURCE_SCHEME,
) -> tuple[dict[str, FileEntry], str]:
    """``scheme``'s digest of every file (``known`` ones of that scheme taken as given), and the
    checkpoint's content hash.

    The content hash covers relative paths and file hashes only, so the same checkpoint in
    another directory hashes the same, and renaming a file changes it. ``stop``: set by another
    thread to end the hashing early (``HashingStopped``) once its result is no longer wanted.
    """
    known = {rel: e for rel, e in (known or {}).items() if e.scheme == scheme}
    todo = [rel for rel in files if rel not in known]
    with progress.task("hashing checkpoint", total=sum((root / rel).stat().st_size for rel in todo)) as task:

        def advance(n: int) -> None:
            if stop is not None and stop.is_set():
                raise HashingStopped
            task.advance(n)

        hashed = sha256_files(root, todo, advance, scheme)
    entries = {rel: known.get(rel) or hashed[rel] for rel in files}
    return entries, content_hash(entries)
