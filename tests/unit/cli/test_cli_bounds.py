"""Every option bounded at the command line's edge (issue 44, item 5): exit 2, one line, no
traceback, nothing written or started.

Before: ``--max-memory`` of 400 digits was an ``OverflowError`` traceback (build, eval, run);
``eval --device cpu --devices 100000`` started spawning torchrun workers; ``quantgate seed`` on
an address the host lacks printed "seeding ... on port 0" and served no one; ``quantgate run``
of a checkpoint intake refuses printed Prefect's tracebacks before its one error line and left
``--out/logs/plan.log``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from support.models import write_tiny_model
from support.servers import free_port

pytestmark = pytest.mark.unit

HUGE = "9" * 400 + "GB"


def _refused(run, option: str) -> str:
    assert run.returncode == 2, (run.returncode, run.stderr[-2000:])
    assert "Traceback" not in run.stderr and run.stdout.strip() == "", run.stderr[-2000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and option in lines[0] and "Fix:" in lines[0], run.stderr
    return lines[0]


@pytest.mark.heavy
@pytest.mark.parametrize(
    "command",
    [
        ["build", "--targets", "hopper-fp8"],
        ["eval", "--device", "cpu", "--artifacts", "{tmp}"],
        ["run", "--device", "cpu", "--checkpoint", "{tmp}"],
    ],
    ids=["build", "eval", "run"],
)
def test_a_400_digit_memory_size_is_refused_in_one_line(cli, tmp_path, command):
    out = tmp_path / "out"
    args = [a.format(tmp=tmp_path) for a in command]
    run = cli(*args, "--max-memory", HUGE, "--out", str(out), timeout=300)
    line = _refused(run, "--max-memory")
    assert "400 digits" in line and len(line) < 400  # the number is not echoed
    assert not out.exists()


def test_more_cpu_processes_than_the_host_has_cores_is_refused_before_any_start(cli, tmp_path):
    out = tmp_path / "out"
    run = cli(
        "eval", "--device", "cpu", "--devices", "100000", "--artifacts", str(tmp_path), "--out", str(out)
    )
    line = _refused(run, "--devices")
    assert "100000 processes asked for on the CPU" in line
    assert "torch.distributed" not in run.stderr and not out.exists()


def test_seed_on_an_address_the_host_lacks_is_refused(cli, tmp_path):
    env = {"QUANTGATE_FLEET_LISTEN": "192.0.2.1:6881"}  # TEST-NET-1: on no host
    run = cli("seed", "--cache-dir", str(tmp_path / "cache"), env=env, timeout=60)
    line = _refused(run, "QUANTGATE_FLEET_LISTEN")
    assert "cannot listen on 192.0.2.1:6881" in line


def test_seed_on_a_port_taken_is_refused(cli, tmp_path):
    port = free_port()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import socket,time; s=socket.create_server(('127.0.0.1',{port})); time.sleep(60)",
        ]
    )
    try:
        import time

        deadline = time.monotonic() + 20  # until the holder listens
        while time.monotonic() < deadline:
            run = cli(
                "seed",
                "--cache-dir",
                str(tmp_path / "cache"),
                env={"QUANTGATE_FLEET_LISTEN": f"127.0.0.1:{port}"},
                timeout=60,
            )
            if run.returncode != 0:
                break
    finally:
        holder.kill()
        holder.wait()
    assert "cannot listen on" in _refused(run, "QUANTGATE_FLEET_LISTEN")


def test_pull_with_seed_on_an_address_the_host_lacks_is_refused_before_the_pull(cli, tmp_path):
    env = {
        "QUANTGATE_FLEET_LISTEN": "192.0.2.1:6881",
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/r/mlflow.db",
    }
    cache = tmp_path / "cache"
    run = cli(
        "pull",
        "m",
        "--target",
        "hopper-fp8",
        "--tenant",
        "chat",
        "--seed",
        "--cache-dir",
        str(cache),
        env=env,
    )
    _refused(run, "QUANTGATE_FLEET_LISTEN")
    assert not cache.exists() and not (tmp_path / "r").exists()  # no registry call, nothing written


@pytest.mark.heavy
def test_a_run_of_a_checkpoint_intake_refuses_prints_one_line_and_leaves_no_out(cli, tmp_path):
    checkpoint = write_tiny_model(tmp_path / "ck")
    (checkpoint / "extra.bin").write_bytes(b"pickle")  # intake refuses pickle files
    out = tmp_path / "run"
    run = cli(
        "run", "--checkpoint", str(checkpoint), "--targets", "hopper-fp8", "--out", str(out), timeout=600
    )
    assert run.returncode == 2, run.stderr[-3000:]
    assert "Traceback" not in run.stderr and "Encountered exception" not in run.stderr, run.stderr[-3000:]
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "extra.bin" in errors[0], run.stderr[-3000:]
    assert not out.exists(), sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
