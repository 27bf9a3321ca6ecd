"""The ``quantgate`` command line run as CI runs it: a fresh interpreter, this environment."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest


@pytest.fixture
def cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``cli("build", ...)``: ``python -m quantgate.cli`` with those arguments, its output captured as text."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "quantgate.cli", *args],
            check=False,
            capture_output=True,
            text=True,
            env=os.environ.copy(),
        )

    return run
