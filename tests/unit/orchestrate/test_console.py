"""``quantgate run``'s console (issue 45, item 8): a few lines per stage, every line in the step's log.

A real step process, run as the flow runs one (``run_process`` with ``console.step_output``), and
a real ``logging.Logger`` standing in for Prefect's console handler: the console gets the stage's
start, heartbeat and end lines and the warnings the step prints, not its metric table, which stays
in the step's log with every other line; a failed step's last log lines reach the console, naming
the log.
"""

from __future__ import annotations

import logging
import sys
import uuid

import pytest

from quantgate.orchestrate import console
from quantgate.orchestrate.steps import run_process
from quantgate.runtime.errors import StepFailed, StepTimeout

pytestmark = pytest.mark.unit

# what ``quantgate eval`` prints: a metric table and its results on stdout, progress and a
# library's warning (twice, at two times: one warning) on stderr
EVAL_STEP = r"""
import sys, time
sys.stderr.write("  wikitext: scoring 0/32\r  wikitext: scoring 16/32\r  wikitext: scoring 32/32\n")
sys.stderr.write("2026-12-05 12:56:50.176 | WARNING  | llmcompressor - No accelerator available!\n")
sys.stderr.write("2026-12-05 12:56:50.203 | WARNING  | llmcompressor - No accelerator available!\n")
sys.stderr.flush()
time.sleep(0.8)
for row in ("┃ metric            ┃ hopper-fp8 ┃", "│ wikitext.kld_mean │ 1.36e-06   │", "│ wikitext.tokens   │ 8064       │"):
    print(row)
print("results: /run/eval-parts/hopper-fp8/summary.json")
"""


class _Console(logging.Handler):
    """A logger of its own, and what reaches the console through it: each record as (level, message)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[str, str]] = []
        self.logger = logging.getLogger(f"test-console-{uuid.uuid4().hex}")
        self.logger.setLevel(logging.INFO)
        self.logger.propagate = False
        self.logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.levelname, record.getMessage()))

    @property
    def text(self) -> str:
        return "\n".join(message for _, message in self.records)


@pytest.fixture
def shown() -> _Console:
    return _Console()


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_the_console_gets_the_stage_lines_and_warnings_not_the_table_and_the_log_every_line(shown, tmp_path):
    log = tmp_path / "logs" / "eval-hopper-fp8.log"
    with console.Stage(shown.logger, "evaluate hopper-fp8", log, heartbeat_s=0.3) as stage:
        run_process("eval-hopper-fp8", _py(EVAL_STEP), log, 30, **console.step_output(stage))
        stage.done("1 suite")

    messages = [message for _, message in shown.records]
    assert messages[0] == f"evaluate hopper-fp8: started (log: {log})"
    assert "evaluate hopper-fp8: still running (" in shown.text  # the step took longer than a heartbeat
    assert messages[-1].startswith("evaluate hopper-fp8: 1 suite in ") and messages[-1].endswith(" s")
    warnings = [message for level, message in shown.records if level == "WARNING"]
    # shown once, without the library's own time stamp
    assert warnings == ["evaluate hopper-fp8: WARNING  | llmcompressor - No accelerator available!"]
    assert "kld_mean" not in shown.text and "8064" not in shown.text and "results:" not in shown.text
    assert len(messages) <= 6  # start, a heartbeat or two, the warning, the end

    kept = log.read_bytes().decode()
    assert kept.startswith("$ ")
    for line in (
        "wikitext: scoring 0/32\r  wikitext: scoring 16/32\r  wikitext: scoring 32/32",  # as written
        "12:56:50.176 | WARNING  | llmcompressor - No accelerator available!",
        "12:56:50.203 | WARNING  | llmcompressor - No accelerator available!",
        "│ wikitext.kld_mean │ 1.36e-06   │",
        "│ wikitext.tokens   │ 8064       │",
        "results: /run/eval-parts/hopper-fp8/summary.json",
    ):
        assert line in kept, line


def test_verbose_relays_every_stdout_line_as_before(shown, tmp_path):
    relayed: list[str] = []
    with console.Stage(shown.logger, "evaluate hopper-fp8", tmp_path / "e.log") as stage:
        run_process(
            "eval", _py(EVAL_STEP), tmp_path / "e.log", 30, **console.step_output(stage, relayed.append)
        )
    assert relayed == [
        "┃ metric            ┃ hopper-fp8 ┃",
        "│ wikitext.kld_mean │ 1.36e-06   │",
        "│ wikitext.tokens   │ 8064       │",
        "results: /run/eval-parts/hopper-fp8/summary.json",
    ]


def test_a_failed_step_prints_the_last_lines_of_its_log_naming_it(shown, tmp_path):
    log = tmp_path / "logs" / "build-draft-int4.log"
    script = (
        "import sys\n"
        "for i in range(40): print(f'calibrating layer {i}', file=sys.stderr)\n"
        "sys.stderr.write('writing 0%\\rwriting 50%\\rwriting 100%\\n')\n"
        "print('error: recipes/w4a16.yaml: group size 128 does not divide 576', file=sys.stderr)\n"
        "sys.exit(2)\n"
    )
    with pytest.raises(StepFailed), console.Stage(shown.logger, "build draft-int4", log) as stage:
        run_process("build-draft-int4", _py(script), log, 30, **console.step_output(stage))

    level, failed = shown.records[-1]
    assert level == "ERROR"
    head, *tail = failed.split("\n")
    assert head.startswith("build draft-int4: failed after ") and "(exit code 2)" in head and str(log) in head
    assert tail[-1].endswith("error: recipes/w4a16.yaml: group size 128 does not divide 576")
    assert tail[-2].endswith("| writing 100%")  # a redrawn bar as a terminal shows it: its last state
    assert tail[-3].endswith("calibrating layer 39") and len(tail) == console.TAIL_LINES
    assert not any(line.endswith("calibrating layer 0") for line in tail)  # the tail only, on the console
    assert "calibrating layer 0\n" in log.read_text()  # every line in the log
    # the error line itself was on the console as it came, too
    assert any("group size 128" in message for lvl, message in shown.records[:-1] if lvl == "WARNING")


def test_a_step_that_hangs_inside_a_progress_bar_is_still_killed_at_its_limit(shown, tmp_path):
    """Stderr is read as it comes, never waiting for a newline: a bar redrawn with \\r and then
    stuck does not keep the deadline from being checked, and what it drew is in the log."""
    log = tmp_path / "slow.log"
    script = "import sys, time\nsys.stderr.write('GPTQ:  50%|#####     |\\r'); sys.stderr.flush()\ntime.sleep(300)\n"
    with pytest.raises(StepTimeout), console.Stage(shown.logger, "build x", log) as stage:
        run_process("build-x", _py(script), log, 2, **console.step_output(stage))
    assert "GPTQ:  50%|#####     |" in log.read_text()
    assert shown.records[-1][0] == "ERROR" and "killed at its time limit" in shown.records[-1][1]


def test_warnings_past_the_limit_are_left_to_the_log(shown, tmp_path):
    stage = console.Stage(shown.logger, "build x", tmp_path / "x.log")
    for i in range(console.MAX_ALARMS + 5):
        stage.scan(f"UserWarning: case {'abcdefghijklmnopqrstuvwxyz'[i]}")
    assert len(shown.records) == console.MAX_ALARMS + 1
    assert shown.records[-1][1] == f"build x: more warnings and errors in {tmp_path / 'x.log'}"


@pytest.mark.parametrize(
    "line, alarm",
    [
        ("/x/modeling_utils.py:3426: UserWarning: Attempting to save a model", True),
        ("2026-12-05 12:56:49.880 | WARNING  | llmcompressor.entrypoints - Disabling", True),
        ("error: recipe.yaml: bad group size. Fix: use 64", True),
        ("ValueError: shapes do not match", True),
        (
            "2026-12-05 12:56:55.629 | METRIC   | llmcompressor.utils.metric_logging:GPTQ:49 - error 3.41",
            False,
        ),
        ("│ wikitext.kld_mean │ 1.36e-06 │", False),
        ("results: /run/eval-parts/source/summary.json", False),
    ],
)
def test_what_counts_as_a_warning_or_an_error(shown, tmp_path, line, alarm):
    console.Stage(shown.logger, "s", tmp_path / "s.log").scan(line)
    assert bool(shown.records) is alarm


def test_prefect_task_lines_are_quiet_unless_verbose():
    prefect_tasks = logging.getLogger("prefect.task_runs")
    before = prefect_tasks.level
    try:
        console.quiet_prefect(verbose=False)
        assert prefect_tasks.getEffectiveLevel() == logging.WARNING
        console.quiet_prefect(verbose=True)
        assert prefect_tasks.level == logging.NOTSET
    finally:
        prefect_tasks.setLevel(before)


@pytest.mark.parametrize(
    "seconds, shown_as", [(20.44, "20.4 s"), (59.94, "59.9 s"), (185, "3 min 05 s"), (7620, "2 h 07 min")]
)
def test_durations_read_as_a_person_reads_them(seconds, shown_as):
    assert console.duration(seconds) == shown_as
