"""The ``quantgate`` command line as a user runs it: a fresh interpreter, this environment."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping


def quantgate(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """``python -m quantgate.cli ARGS``, output captured as text; ``env`` is added to this process's."""
    return subprocess.run(
        [sys.executable, "-m", "quantgate.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )
