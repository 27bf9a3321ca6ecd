"""Fixtures for the gate: a trimmed real evaluation output.

``fixtures/e1`` is ``quantgate eval --profile smoke`` of the default model's source and four
artifacts (long generated strings trimmed), written by ``fixtures/make_e1.py``; tests copy it into
tmp_path before changing it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

FIXTURE = Path(__file__).parent / "fixtures" / "e1"


@pytest.fixture
def e1(tmp_path) -> Path:
    return Path(shutil.copytree(FIXTURE, tmp_path / "e1"))
