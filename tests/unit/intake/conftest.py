"""Fixtures for intake tests: the policy from gates.yaml, and a way to prove nothing was written."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from quantgate.config.gates import Gates, load_gates
from quantgate.intake import intake
from quantgate.runtime.errors import CheckpointError


@pytest.fixture(scope="session")
def policy(repo_root, catalog) -> Gates:
    return load_gates(repo_root / "gates.yaml", catalog)


def snapshot(directory: Path) -> dict[str, tuple]:
    """Every entry under ``directory`` (links not followed): kind, size, mtime and content."""
    found: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(directory, followlinks=False):
        for name in (*dirnames, *filenames):
            path = Path(dirpath) / name
            st = path.lstat()
            if path.is_symlink():
                found[str(path)] = ("link", os.readlink(path))
            elif path.is_file():
                found[str(path)] = (
                    "file",
                    st.st_size,
                    st.st_mtime_ns,
                    hashlib.sha256(path.read_bytes()).hexdigest(),
                )
            else:
                found[str(path)] = ("dir", st.st_mtime_ns)
    return found


@pytest.fixture
def refuse(policy) -> Callable[..., CheckpointError]:
    """Run intake expecting ``error``; check the message names ``names`` and nothing changed."""

    def run(checkpoint: Path, error: type[CheckpointError], *names: str) -> CheckpointError:
        before = snapshot(checkpoint) if checkpoint.is_dir() else None
        with pytest.raises(error) as caught:
            intake(checkpoint, policy)
        message = str(caught.value)
        for name in names:
            assert name in message, f"{name!r} not named in: {message}"
        assert "Fix:" in message and caught.value.fix
        assert caught.value.exit_code == 2
        if before is not None:
            assert snapshot(checkpoint) == before, "intake changed the checkpoint directory"
        return caught.value

    return run


@pytest.fixture(name="snapshot")
def snapshot_fixture() -> Callable[[Path], dict[str, tuple]]:
    return snapshot
