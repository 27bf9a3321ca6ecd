"""Repair fixtures: a project (targets, recipes, one small text suite, gates set per test)."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.repair_project import make_project


@pytest.fixture
def project(tmp_path, repo_root) -> Path:
    return make_project(tmp_path / "project", repo_root)
