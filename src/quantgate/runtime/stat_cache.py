"""Per-file sha256 results kept against each file's stat: a file is hashed once while it is unchanged.

Why: hashing a large checkpoint or artifact takes seconds to minutes (an 8B artifact's 9 GB took 9 s
to verify on an H200 worker, a 235B one would take minutes), and a run reads each several times:
intake and every step's ``intake.confirm`` (the source), the build's manifest and every evaluation's
verification (an artifact). Like git's index, a file whose (device, inode, size, mtime_ns, ctime_ns)
is unchanged holds the bytes it held when hashed. The stat is taken before the file is read, and
ctime cannot be set back by its owner, so a file rewritten meanwhile misses. A cache that cannot be
read (missing, another version, damaged) is a miss, never an error; one that cannot be written
costs a re-hash, nothing else. Intake records a file only after its NaN/Inf scan passed too; a
build records its artifact's files once installed, and an evaluation what it verified.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from quantgate.runtime.atomic import write_json
from quantgate.runtime.hashing import FileEntry

_VERSION = 1


def _stat_key(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _cache_file(cache: Path, root: Path) -> Path:
    return cache / f"{hashlib.sha256(str(root).encode()).hexdigest()[:32]}.json"


class StatCache:
    """The entries of one checkpoint directory; ``None`` as the cache directory turns it off.

    Only the expensive results are kept: headers, config, shapes and the file list are read
    again every time, and the content hash is recomputed from the per-file entries.
    """

    def __init__(self, cache: Path | None, root: Path, files: list[str]) -> None:
        self._root = root
        self._path = _cache_file(cache, root) if cache is not None else None
        # stat every file before anything reads it (see the module docstring)
        self._stats = {rel: _stat_key(root / rel) for rel in files}
        self.known: dict[str, FileEntry] = {}
        if self._path is None:
            return
        try:
            saved = json.loads(self._path.read_text())
            if saved.get("version") != _VERSION or saved.get("root") != str(root):
                return
            for rel, item in saved["files"].items():
                if rel in self._stats and item["stat"] == self._stats[rel]:
                    self.known[rel] = FileEntry(
                        sha256=item["sha256"], bytes=item["bytes"], scheme=item.get("scheme", "sha256")
                    )
        except (OSError, ValueError, KeyError, TypeError):
            self.known = {}

    def save(self, entries: dict[str, FileEntry]) -> None:
        """Record every file as hashed and scanned (call only after both passed)."""
        if self._path is None:
            return
        files = {rel: {"stat": self._stats[rel], **entries[rel].model_dump()} for rel in entries}
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            write_json(self._path, {"version": _VERSION, "root": str(self._root), "files": files})
        except OSError:
            pass  # a read-only cache only means hashing again next time
