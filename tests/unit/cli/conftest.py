"""The ``quantgate`` command line run as CI runs it: a fresh interpreter, this environment."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

from support.cli import quantgate


@pytest.fixture
def cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``cli("build", ...)``: ``python -m quantgate.cli`` with those arguments, its output captured as text."""
    return quantgate
