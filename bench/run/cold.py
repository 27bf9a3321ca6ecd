"""Where a bench run runs: the environment of a cold ``quantgate run`` (as on a fresh machine, inside
one scratch folder), and the machine record its JSON carries."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cold_env(tmp: Path) -> dict[str, str]:
    """An empty quantgate cache (the default model converted again, no evaluation reference), an
    empty Prefect home (no task results to reuse, ephemeral API) and a new local registry, all
    under ``tmp``; the rest of this process's environment."""
    env = {
        **os.environ,
        "QUANTGATE_CACHE": str(tmp / "cache"),
        "PREFECT_HOME": str(tmp / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp / 'registry' / 'mlflow.db'}",
        "QUANTGATE_ARTIFACT_URI": (tmp / "registry" / "artifacts").as_uri(),
    }
    env.pop("PREFECT_API_URL", None)
    return env


def machine() -> dict[str, object]:
    """Cores, Python and platform, as every bench JSON records them."""
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}
