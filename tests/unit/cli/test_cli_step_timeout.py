"""``--step-timeout`` must be a time limit (issue 25, every float finite): click reads "inf" and
"nan" as floats, and before this check ``quantgate run`` planned with them (plan.json holds
``null`` for an infinite limit, so every step then refused the plan)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.unit, pytest.mark.heavy]


@pytest.mark.parametrize("value", ["nan", "inf", "0"])
def test_a_step_timeout_that_is_no_time_limit_is_refused_before_any_work(cli, tmp_path, value):
    out = tmp_path / "run"
    run = cli(
        "run", "--checkpoint", str(tmp_path / "ck"), f"--step-timeout={value}", "--out", str(out), timeout=300
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines() == [
        f"error: --step-timeout: {float(value)} is not a time limit. Fix: pass a finite number of seconds above 0"
    ]
    assert not out.exists()
