"""Where quantgate finds its project files and keeps its caches.

The project root (targets/, recipes/, gates.yaml, ...) and the cache (converted default model,
calibration sets, pulls) are read from the environment here and nowhere else. Entry points
(the CLI, the flows) resolve them and pass them down; library functions take them as
arguments, and the few that default one (``pull``'s cache, the FP8 engine's config cache) call
these.
"""

from __future__ import annotations

from pathlib import Path

from quantgate.config.environment import path_setting
from quantgate.config.loader import project_of

PACKAGE_ROOT = Path(__file__).resolve().parents[3]  # src/quantgate/config/paths.py -> the checkout


def project_root() -> Path:
    """``$QUANTGATE_ROOT``, else the nearest directory up from the working one with gates.yaml and
    targets/, else the checkout this package was installed from."""
    env = path_setting("QUANTGATE_ROOT")
    if env:
        return env.resolve()
    return project_of(Path.cwd()) or PACKAGE_ROOT


def cache_dir() -> Path:
    """``$QUANTGATE_CACHE``, else ``~/.cache/quantgate``."""
    env = path_setting("QUANTGATE_CACHE")
    return env.resolve() if env else Path.home() / ".cache" / "quantgate"
