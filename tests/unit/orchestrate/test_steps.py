"""Heavy steps run as processes: exit codes keep the CLI contract, a timeout kills the whole group."""

from __future__ import annotations

import sys
import time

import pytest

from quantgate.orchestrate.steps import run_process
from quantgate.runtime.errors import StepFailed, StepTimeout, TransientError

pytestmark = pytest.mark.unit


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_step_that_succeeds_streams_its_stdout_to_the_log_and_the_callback(tmp_path):
    lines = []
    run_process("ok", _py("print('report: /x/report.md')"), tmp_path / "ok.log", 30, on_line=lines.append)
    assert lines == ["report: /x/report.md"]
    assert "report: /x/report.md" in (tmp_path / "ok.log").read_text()


@pytest.mark.parametrize("code", [1, 2])
def test_a_failed_step_keeps_its_exit_code_and_shows_the_log_tail(tmp_path, code):
    script = f"import sys; print('building'); sys.stderr.write('error: recipe.yaml: bad group size\\n'); sys.exit({code})"
    with pytest.raises(StepFailed) as caught:
        run_process("build-x", _py(script), tmp_path / "x.log", 30)
    assert caught.value.exit_code == code
    assert "bad group size" in str(caught.value) and str(tmp_path / "x.log") in str(caught.value)
    assert not isinstance(caught.value, TransientError)


def test_exit_75_is_transient(tmp_path):
    with pytest.raises(TransientError):
        run_process("pull", _py("import sys; sys.exit(75)"), tmp_path / "t.log", 30)


def test_a_step_past_its_limit_is_killed_with_its_children(tmp_path):
    pid_file = tmp_path / "child.pid"
    # the step starts a grandchild that would outlive a plain kill of the step itself
    script = (
        "import subprocess, sys, time; "
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(300)"
    )
    with pytest.raises(StepTimeout):
        run_process("slow", _py(script), tmp_path / "slow.log", 3)
    child = int(pid_file.read_text())
    for _ in range(50):  # the kernel reaps the orphan shortly after the group is killed
        try:
            with open(f"/proc/{child}/stat") as stat:
                if stat.read().split()[2] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"grandchild {child} survived the step's timeout")
