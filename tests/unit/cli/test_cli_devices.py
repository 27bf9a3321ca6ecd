"""``--devices`` and ``--max-memory`` on ``quantgate run`` (issue 29): the run passes them to every
evaluation step, so a value no step could take is refused before the flow starts, not by each step
after the builds."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.unit, pytest.mark.heavy]


@pytest.mark.parametrize(
    ("value", "says"),
    [("two", "not a number of devices"), ("0", "not a number of devices"), ("-1", "not a number of devices")],
)
def test_a_device_count_no_step_could_take_is_refused_before_any_work(cli, tmp_path, value, says):
    out = tmp_path / "run"
    run = cli("run", "--checkpoint", str(tmp_path / "ck"), "--devices", value, "--out", str(out), timeout=300)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert "--devices" in run.stderr and says in run.stderr and "Fix:" in run.stderr
    assert not out.exists()


@pytest.mark.parametrize("value", ["lots", "40", "0GB"])
def test_a_memory_budget_no_step_could_take_is_refused_before_any_work(cli, tmp_path, value):
    out = tmp_path / "run"
    run = cli(
        "run", "--checkpoint", str(tmp_path / "ck"), "--max-memory", value, "--out", str(out), timeout=300
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert "--max-memory" in run.stderr and "Fix:" in run.stderr
    assert not out.exists()
