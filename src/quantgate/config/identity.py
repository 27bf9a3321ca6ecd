"""Identity from content: the digest a cache or build key takes of validated configuration.

Why not a file's bytes: a config may ``include:`` others, and a key over the top file alone stays
the same when an included file changes, so a run would serve a stale artifact or verdict from the
cache. The loader's validated model holds everything every file contributed (includes merged,
defaults filled), and comments or key order, which change nothing, change no key.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from quantgate.runtime.hashing import sha256_file


def content_digest(value: BaseModel | Any) -> str:
    """sha256 of a validated model's content (or of JSON-able data), canonical: keys sorted."""
    data = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def file_digest(path: Path) -> str:
    """sha256 of a data file a config points at (a suite's items), or of its absence: a file the
    key names is part of what was read."""
    try:
        return sha256_file(Path(path)).sha256
    except OSError:
        return f"unreadable:{path}"
