"""Where quantgate finds its project files and keeps its caches.

The project root (targets/, recipes/, gates.yaml, ...) and the cache (converted default model,
calibration sets, pulls) are read from the environment here and nowhere else. Entry points
(the CLI, the flows) resolve them and pass them down; library functions take them as
arguments, and the few that default one (``pull``'s cache, the FP8 engine's config cache) call
these.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def project_root() -> Path:
    """``$QUANTGATE_ROOT``, else the nearest directory up from the working one with gates.yaml and
    targets/, else the checkout this package was installed from."""
    env = os.environ.get("QUANTGATE_ROOT")
    if env:
        return Path(env).resolve()
    cwd = Path.cwd()
    for candidate in (cwd, *cwd.parents):
        if (candidate / "gates.yaml").exists() and (candidate / "targets").is_dir():
            return candidate
    return PACKAGE_ROOT


def cache_dir() -> Path:
    """``$QUANTGATE_CACHE``, else ``~/.cache/quantgate``."""
    env = os.environ.get("QUANTGATE_CACHE")
    return Path(env).expanduser().resolve() if env else Path.home() / ".cache" / "quantgate"
