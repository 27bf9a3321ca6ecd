"""Two ``quantgate run`` on one ``--out``: the second is refused, the first finishes as its own.

Before the fix there was no lock: each run wrote ``<out>/plan.json`` in turn, run A's build and
eval steps read run B's plan, and A's report (model "alpha") was computed from B's checkpoint.
Real commands, each with Prefect's ephemeral server, on two copies of the tiny random Llama
("alpha" and "beta", told apart by their content hash: beta's weights are scaled).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from quantgate.orchestrate.out_lock import HOLDER
from support.gates import LENIENT_HOPPER

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _scaled_copy(source: Path, dest: Path) -> Path:
    """A copy of the tiny model whose weights differ (another content hash, another model)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, dest)
    weights = load_file(dest / "model.safetensors")
    save_file(
        {k: v * 1.01 for k, v in weights.items()}, dest / "model.safetensors", metadata={"format": "pt"}
    )
    return dest


def _run(env: dict[str, str], checkpoint: Path, gates: Path, out: Path, home: Path) -> subprocess.Popen:
    args = [
        "--checkpoint",
        str(checkpoint),
        "--gates",
        str(gates),
        "--suites",
        "wikitext",
        "--targets",
        "hopper-fp8",
    ]
    return subprocess.Popen(
        [sys.executable, "-m", "quantgate.cli", "run", *args, "--out", str(out), "--no-publish"],
        env={**env, "PREFECT_HOME": str(home)},  # each its own ephemeral server
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_until_started(run: subprocess.Popen, out: Path, seconds: float = 600) -> None:
    """Until run A holds ``out`` (its holder record; before the fix, its plan.json instead)."""
    deadline = time.monotonic() + seconds
    while not ((out / HOLDER).exists() or (out / "plan.json").exists()):
        assert run.poll() is None, f"run A ended early: {run.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, "run A never started"
        time.sleep(0.2)


def test_a_second_run_on_the_same_out_is_refused_and_the_first_is_its_own(tmp_path, _tiny_models):
    (tmp_path / "gates.yaml").write_text(LENIENT_HOPPER)
    alpha = Path(shutil.copytree(_tiny_models["llama"], tmp_path / "alpha"))
    beta = _scaled_copy(_tiny_models["llama"], tmp_path / "beta")
    env = {
        **os.environ,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "600",  # two servers start on a busy machine
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'registry' / 'mlflow.db'}",
        "QUANTGATE_ARTIFACT_URI": (tmp_path / "registry" / "artifacts").as_uri(),
    }
    env.pop("PREFECT_API_URL", None)
    out = tmp_path / "run"
    run_a = _run(env, alpha, tmp_path / "gates.yaml", out, tmp_path / "prefect-a")
    try:
        _wait_until_started(run_a, out)
        holder = json.loads((out / HOLDER).read_text()) if (out / HOLDER).exists() else {}
        run_b = _run(env, beta, tmp_path / "gates.yaml", out, tmp_path / "prefect-b")
        _, b_err = run_b.communicate(timeout=900)
        # refused while run A still holds --out, not after waiting for it to let go
        still_held = (out / HOLDER).exists() and run_a.poll() is None
        assert run_b.returncode == 2, (run_b.returncode, b_err[-3000:])  # before the fix: it ran, mixing
        error = b_err.strip()
        assert error.count("\n") == 0 and error.startswith("error: ") and "Fix:" in error, error
        assert f"pid {run_a.pid} on " in error and str(holder.get("run_id")) in error and "own --out" in error
        assert still_held
        a_out, a_err = run_a.communicate(timeout=1800)
    finally:
        if run_a.poll() is None:
            run_a.kill()
            run_a.wait()
    assert run_a.returncode == 0, a_out[-3000:] + a_err[-3000:]
    outcome = json.loads((out / "outcome.json").read_text())
    report = json.loads((out / "report" / "report.json").read_text())
    plan = json.loads((out / "plan.json").read_text())
    assert plan["source"]["path"] == str(alpha) and plan["run_id"] == outcome["flow_run_id"]
    assert report["source_hash"] == outcome["source_hash"] == plan["source"]["content_hash"]
    assert not (out / HOLDER).exists()  # released with the run
