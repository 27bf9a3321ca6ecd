"""``quantgate run`` stopped from outside: SIGTERM (a CI job cancelled, a pod evicted) and kill -9.

Each run here is the real command on the tiny random Llama with Prefect's ephemeral server (no
``PREFECT_API_URL``), as a laptop or a CI job runs it. What a user would notice before the fix:
SIGTERM left the run waiting for its running build or evaluation (minutes to hours); kill -9 left
the step running as an orphan; and the killed run's heavy-step slot stayed taken, so the next
run waited forever.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from quantgate.orchestrate.reaper import children
from support.gates import LENIENT_HOPPER

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def run_env(tmp_path, _tiny_models):
    (tmp_path / "gates.yaml").write_text(LENIENT_HOPPER)
    env = {
        **os.environ,
        "PREFECT_HOME": str(tmp_path / "prefect-home"),  # its own ephemeral server's database and leases
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'registry' / 'mlflow.db'}",
        "QUANTGATE_ARTIFACT_URI": (tmp_path / "registry" / "artifacts").as_uri(),
    }
    env.pop("PREFECT_API_URL", None)
    args = ["--checkpoint", str(_tiny_models["llama"]), "--gates", str(tmp_path / "gates.yaml")]
    return env, [*args, "--suites", "wikitext", "--targets", "hopper-fp8"]


def _start(env: dict[str, str], args: list[str], out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "quantgate.cli", "run", *args, "--out", str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _steps_of(out: Path) -> list[int]:
    """Pids of the ``quantgate`` step processes (build, eval) working on run directory ``out``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        step = cmdline[3:4] in ([b"build"], [b"eval"])  # python -m quantgate.cli <step> ...
        if b"quantgate.cli" in cmdline and step and any(str(out).encode() in part for part in cmdline[4:]):
            pids.append(int(proc.name))
    return pids


def _wait_for_step(run: subprocess.Popen, out: Path, seconds: float = 300) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert run.poll() is None, f"the run ended before any step started:\n{run.stdout.read()[-3000:]}"
        steps = _steps_of(out)
        if steps:
            return steps
        time.sleep(0.5)
    pytest.fail("no step started")


def _gone(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(Path(f"/proc/{pid}").exists() for pid in pids):
            return True
        time.sleep(0.2)
    return False


def test_sigterm_stops_the_run_and_its_running_step_at_once_and_publishes_nothing(run_env, tmp_path):
    env, args = run_env
    out = tmp_path / "run"
    run = _start(env, args, out)
    steps = _wait_for_step(run, out)
    spawned = children(run.pid)  # the step and Prefect's ephemeral API server
    run.send_signal(signal.SIGTERM)
    try:
        log, _ = run.communicate(timeout=60)  # the step it runs would take minutes more
    except subprocess.TimeoutExpired:
        run.kill()
        pytest.fail("quantgate run kept running after SIGTERM")
    assert run.returncode == 128 + signal.SIGTERM, log[-3000:]  # as a shell reports a SIGTERM
    assert _gone(steps, 15), "the run's step kept running after the run stopped"
    assert _gone(list(spawned), 15), "the run left a process running (its Prefect server?)"
    assert "running step(s) stopped, nothing published" in log
    assert not (tmp_path / "registry").exists()
    assert not (out / "outcome.json").exists()


def test_a_killed_runs_step_ends_and_its_slot_is_free_for_the_next_run(run_env, tmp_path):
    env, args = run_env
    first = _start(env, args, tmp_path / "killed")
    steps = _wait_for_step(first, tmp_path / "killed")
    spawned = children(first.pid)
    first.kill()  # kill -9: no handler runs, the slot's lease is never given back
    first.wait()
    assert _gone(steps, 15), "the killed run's step kept running as an orphan"
    assert _gone(list(spawned), 15), "the killed run left a process running (its Prefect server?)"

    second = _start(env, args, tmp_path / "next")
    try:
        log, _ = second.communicate(timeout=600)  # the slot is reclaimed once its lease (60 s) expires
    except subprocess.TimeoutExpired:
        second.kill()
        pytest.fail("the next run waited for the killed run's slot")
    assert second.returncode == 0, log[-3000:]
    assert re.search(r"freed 1 'quantgate-heavy' slot\(s\) that no live run holds", log), log[-3000:]
