"""The command line prints names as data (issue 25): no markup, no raw escapes, one error one line.

Before: a model named ``ck[/]`` ended ``quantgate gate`` in a rich MarkupError traceback (exit 1)
after its report was written; ``[bold]`` and ``:thumbs_up:`` rendered; ANSI escapes reached the
terminal raw; a newline in a path forged a second ``error:`` line.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

E1 = Path(__file__).resolve().parents[1] / "gate" / "fixtures" / "e1"
NAME = "ck[/] [bold]b[/bold] :thumbs_up: \x1b[31mred\x1b]0;t\x07\nerror: forged"


@pytest.mark.heavy
def test_gate_prints_a_hostile_model_name_as_text(cli, tmp_path):
    results = Path(shutil.copytree(E1, tmp_path / "e1"))
    run_json = json.loads((results / "run.json").read_text())
    run_json["model"] = NAME
    (results / "run.json").write_text(json.dumps(run_json))
    out = tmp_path / "report"
    run = cli("gate", "--results", str(results), "--out", str(out), "--model-class", "draft")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    shown = "ck[/] [bold]b[/bold] :thumbs_up: \\x1b[31mred\\x1b]0;t\\x07\\nerror: forged"
    assert shown in " ".join(run.stdout.split())  # the table's title may wrap
    assert "\x1b" not in run.stdout and "\x07" not in run.stdout and "👍" not in run.stdout
    assert not any(line.startswith("error:") for line in run.stdout.splitlines() + run.stderr.splitlines())


def test_one_error_is_one_line(cli, tmp_path):
    results = tmp_path / "ck\x1b[31m\nerror: forged second line"
    run = cli("gate", "--results", str(results), "--out", str(tmp_path / "out"))
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        f"error: {tmp_path}/ck\\x1b[31m\\nerror: forged second line: no summary.json here"
    )
