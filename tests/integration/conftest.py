"""Integration fixtures: the real default model, converted once per session, and a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from quantgate.config import cache_dir
from quantgate.embedded.smollm2 import default_checkpoint
from quantgate.runtime.memory import peak_rss_bytes


@pytest.fixture(scope="session")
def default_model(tmp_path_factory) -> Path:
    shared = os.environ.get("QUANTGATE_TEST_CACHE")
    return default_checkpoint(Path(shared) if shared else tmp_path_factory.getbasetemp() / "cache")


@dataclass
class CliRun:
    returncode: int
    stdout: str
    stderr: str
    peak_rss_bytes: int


def _run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> CliRun:
    """Run ``quantgate`` as a user would, in its own process, and measure its peak RSS.

    The peak is the child's ``VmHWM`` polled from outside until it exits: ``ru_maxrss`` from
    ``wait4`` would include this (large) test process's memory, inherited across fork and exec.
    """
    full_env = {**os.environ, "QUANTGATE_CACHE": str(cache_dir()), **(env or {})}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "quantgate.cli", *args], cwd=cwd, env=full_env, stdout=out, stderr=err
        )
        peak = 0
        while proc.poll() is None:
            peak = max(peak, peak_rss_bytes(proc.pid) or 0)
            time.sleep(0.05)
        out.seek(0)
        err.seek(0)
        return CliRun(proc.returncode, out.read(), err.read(), peak)


@pytest.fixture(scope="session")
def run_cli():
    """``run_cli(*args) -> CliRun``: the command line in a separate process."""
    return _run_cli


ALL_TARGETS = ["hopper-fp8", "rocm-cdna3-fp8", "blackwell-nvfp4", "draft-int4"]


@pytest.fixture(scope="session")
def default_artifacts(default_model, tmp_path_factory) -> tuple[Path, CliRun]:
    """The four artifacts of the default model, built once per session through the CLI."""
    out = tmp_path_factory.mktemp("default-artifacts")
    run = _run_cli(
        "build", "--checkpoint", str(default_model), "--targets", ",".join(ALL_TARGETS), "--out", str(out)
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return out, run
