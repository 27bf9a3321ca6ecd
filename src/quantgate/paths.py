"""Where quantgate finds its project files and keeps its caches.

The project root (targets/, recipes/, gates.yaml, ...) is the working directory's checkout
by default, or ``QUANTGATE_ROOT``; the cache (converted default model, calibration sets) is
``QUANTGATE_CACHE`` or ``~/.cache/quantgate``. Both are explicit arguments everywhere in the
library; only the CLI reads the environment.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def project_root() -> Path:
    env = os.environ.get("QUANTGATE_ROOT")
    if env:
        return Path(env).resolve()
    cwd = Path.cwd()
    for candidate in (cwd, *cwd.parents):
        if (candidate / "gates.yaml").exists() and (candidate / "targets").is_dir():
            return candidate
    return PACKAGE_ROOT


def cache_dir() -> Path:
    env = os.environ.get("QUANTGATE_CACHE")
    return Path(env).expanduser().resolve() if env else Path.home() / ".cache" / "quantgate"
