"""A run owns its --out: a second holder is refused naming the first, a killed holder never blocks,
and a step refuses a plan another run wrote. Real processes hold the lock; real plans are read."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from quantgate.runtime.errors import InputError, UsageError

pytestmark = pytest.mark.unit

HOLD = """
import sys, time
from pathlib import Path
from quantgate.orchestrate import out_lock
with out_lock.held(Path(sys.argv[1]), sys.argv[2]):
    print("held", flush=True)
    time.sleep(600)
"""


def _holder_process(out, run_id: str) -> subprocess.Popen:
    """Another process holding ``out`` (as another ``quantgate run`` would), once it says so."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(out), run_id],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "held\n", proc.communicate()[1][-2000:]
    return proc


def test_a_second_run_on_the_same_out_is_refused_naming_the_first(tmp_path):
    from quantgate.orchestrate import out_lock

    first = _holder_process(tmp_path / "run", "run-A")
    try:
        with pytest.raises(UsageError) as err, out_lock.held(tmp_path / "run", "run-B"):
            pass
        message = str(err.value)
        assert err.value.exit_code == 2 and "\n" not in message
        assert message.startswith(str(tmp_path / "run"))
        assert f"run run-A (pid {first.pid} on {socket.gethostname()}" in message
        assert "own --out" in message
    finally:
        first.kill()
        first.wait()


def test_a_killed_runs_lock_does_not_block_the_next(tmp_path):
    from quantgate.orchestrate import out_lock

    first = _holder_process(tmp_path / "run", "run-A")
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    with out_lock.held(tmp_path / "run", "run-B") as holder:  # the kernel dropped the flock with the process
        assert holder["run_id"] == "run-B" and holder["pid"] == os.getpid()
        assert out_lock.read_holder(tmp_path / "run") == holder
    assert out_lock.read_holder(tmp_path / "run") is None  # released: its record goes with it
    assert not (tmp_path / "run" / out_lock.LOCK).exists()


def test_a_run_that_writes_nothing_leaves_no_out(tmp_path):
    """A run refused for bad input (before it plans) must leave no --out behind."""
    from quantgate.orchestrate import out_lock

    with out_lock.held(tmp_path / "new" / "run", "run-A"):
        assert (tmp_path / "new" / "run" / out_lock.HOLDER).exists()
    assert not (tmp_path / "new").exists()


def test_the_lock_is_reentrant_in_one_process_and_a_nested_hold_names_the_run(tmp_path):
    from quantgate.orchestrate import out_lock

    with out_lock.held(tmp_path / "run"):  # quantgate run, before the flow run has an id
        with out_lock.held(tmp_path / "run", "flow-run-1"):  # the flow, inside it
            assert out_lock.read_holder(tmp_path / "run")["run_id"] == "flow-run-1"
        assert out_lock.read_holder(tmp_path / "run")["run_id"] == "flow-run-1"
    with out_lock.held(tmp_path / "run", "next"):
        pass


@pytest.fixture
def no_flock(monkeypatch):
    """Simulated: a file system without flock (some network and FUSE mounts answer ENOLCK)."""
    import fcntl

    def refuse(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", refuse)


def _record(out, **fields):
    from quantgate.orchestrate import out_lock

    out.mkdir(parents=True, exist_ok=True)
    (out / out_lock.HOLDER).write_text(json.dumps(fields))


def test_without_flock_a_dead_holder_on_this_host_is_stale(no_flock, tmp_path):
    from quantgate.orchestrate import out_lock
    from quantgate.orchestrate.reaper import start_time

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    _record(tmp_path / "run", run_id="dead", pid=gone.pid, pid_started="1", host=socket.gethostname())
    with out_lock.held(tmp_path / "run", "next") as holder:
        assert holder["run_id"] == "next"
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.2)
        _record(
            tmp_path / "run",
            run_id="live",
            pid=live.pid,
            pid_started=start_time(live.pid),
            host=socket.gethostname(),
        )
        with pytest.raises(UsageError, match="in use by run live"), out_lock.held(tmp_path / "run", "next"):
            pass
    finally:
        live.kill()
        live.wait()


def test_without_flock_a_holder_on_another_host_is_refused_with_the_way_out(no_flock, tmp_path):
    from quantgate.orchestrate import out_lock

    _record(tmp_path / "run", run_id="far", pid=1, pid_started="1", host="another-host")
    refused = pytest.raises(UsageError, match=r"on another-host.*remove .*\.quantgate-run\.holder\.json")
    with refused, out_lock.held(tmp_path / "run", "next"):
        pass


def _plan(checkpoint, repo_root, out, run_id):
    from quantgate.config import cache_dir
    from quantgate.orchestrate.plan import make_plan

    return make_plan(
        checkpoint=checkpoint,
        targets=["hopper-fp8"],
        tenants=None,
        suites=["wikitext"],
        profile="smoke",
        root=repo_root,
        gates=None,
        cache=cache_dir(),
        data_dir=None,
        calibration=None,
        out=out,
        step_timeout_s=60,
        run_id=run_id,
    )


@pytest.mark.heavy
def test_a_step_refuses_a_plan_another_run_wrote(tiny_llama, repo_root, tmp_path, monkeypatch):
    """Run A's build step, started with A's id, finds run B's plan.json in the shared --out: it
    stops (exit 2, one line naming the plan) instead of building B's checkpoint as A's."""
    from quantgate.orchestrate.plan import RUN_ID_ENV, read_plan

    plan_b = _plan(tiny_llama, repo_root, tmp_path / "run", "run-B")
    monkeypatch.setenv(RUN_ID_ENV, "run-A")
    with pytest.raises(InputError, match="belongs to run run-B, not to run run-A") as err:
        read_plan(plan_b.file)
    assert err.value.exit_code == 2 and str(err.value).startswith(str(plan_b.file))
    with pytest.raises(InputError, match="belongs to run run-B"):
        plan_b.model_copy(update={"run_id": "run-A"}).confirm_own()  # the gate's and publish's check
    monkeypatch.setenv(RUN_ID_ENV, "run-B")
    assert read_plan(plan_b.file) == plan_b
    plan_b.confirm_own()

    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "quantgate.cli",
            "build",
            "--plan",
            str(plan_b.file),
            "--out",
            str(tmp_path / "arts"),
        ],
        env={**os.environ, RUN_ID_ENV: "run-A"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert build.returncode == 2, build.stderr[-3000:]
    assert build.stderr.strip().count("\n") == 0 and "belongs to run run-B" in build.stderr
    assert not (tmp_path / "arts" / "hopper-fp8").exists()
