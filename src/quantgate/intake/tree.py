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
from pathlib import Path

from quantgate.errors import (
    CheckpointError,
    EmptyCheckpointError,
    PickleFileError,
    RemoteCodeError,
    SymlinkEscapeError,
)
from quantgate.hashing import FileEntry, content_hash, sha256_files
from quantgate.progress import SILENT, Progress

PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt"})
CODE_SUFFIXES = frozenset({".py", ".pyc", ".pyw"})


def list_files(root: Path) -> list[str]:
    """Every file of the checkpoint (relative POSIX paths, sorted), after the symlink checks.

    ``root`` must be resolved. A symlink whose target resolves inside ``root`` is kept (a
    symlinked file counts as a file, hashed by its target's content; a symlinked directory
    is not descended, its target is already in the tree). One that points outside, or at
    nothing, is refused. Anything that is neither a file nor a directory is refused too,
    since reading a FIFO or a device would hang or read forever.
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
            mode = entry.lstat().st_mode
            if stat.S_ISLNK(mode):
                if _check_symlink(root, entry).is_file():
                    files.append(entry.relative_to(root).as_posix())
            elif stat.S_ISREG(mode):
                files.append(entry.relative_to(root).as_posix())
            elif not stat.S_ISDIR(mode):
                raise CheckpointError(
                    entry,
                    "not a regular file, directory or symlink",
                    "remove it from the checkpoint directory",
                )
    return sorted(files)


def _check_symlink(root: Path, link: Path) -> Path:
    target = link.resolve(strict=False)
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


def hash_files(
    root: Path, files: list[str], progress: Progress = SILENT, known: dict[str, FileEntry] | None = None
) -> tuple[dict[str, FileEntry], str]:
    """sha256 of every file (``known`` ones taken as given), and the checkpoint's content hash.

    The content hash covers relative paths and file hashes only, so the same checkpoint in
    another directory hashes the same, and renaming a file changes it.
    """
    known = known or {}
    todo = [rel for rel in files if rel not in known]
    with progress.task("hashing checkpoint", total=sum((root / rel).stat().st_size for rel in todo)) as task:
        hashed = sha256_files(root, todo, task.advance)
    entries = {rel: known.get(rel) or hashed[rel] for rel in files}
    return entries, content_hash(entries)
