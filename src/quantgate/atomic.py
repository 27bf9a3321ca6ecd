"""Atomic file writes: a reader sees the old file or the new one, never half of either.

Every result quantgate writes (eval records, summaries, reports, calibration sets) goes
through here: the bytes go to a temporary file in the same directory, which is renamed over
the target only once complete; a failure removes the temporary file. Files are made
world-readable (0644): ``mkstemp`` creates 0600, and reports are meant to be shared.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_bytes(path: Path, data: bytes, mode: int = 0o644) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str, mode: int = 0o644) -> None:
    write_bytes(path, text.encode("utf-8"), mode)


def write_json(path: Path, payload: Any, **dump_kwargs: Any) -> None:
    write_text(path, json.dumps(payload, indent=1, **dump_kwargs) + "\n")
