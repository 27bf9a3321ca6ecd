"""One recorded evaluation gated by an older tree and by this one (issue 24): every verdict and floor
status that differs, and the approvals of each.

Usage:  .venv/bin/python bench/gate/gate_before_after.py --results E --before COMMIT [--out F]

The cheap half of ``main_job_before_after.py``: the same per-item records (``E``, e.g. the default
model's real smoke evaluation in ``tests/unit/gate/fixtures/e1``) go through ``quantgate gate`` of
both trees, each as a whole command with no registry baselines, so a difference is the gate's alone
(evaluation, and what it no longer runs, is the other half). Printed as JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

# the cold environment and the verdict comparison of the run benchmarks (bench/run/)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "run"))

from cold import cold_env, machine
from main_job_designs import _floors, differ

ROOT = Path(__file__).resolve().parents[2]


def _gate(tree: Path, results: Path, out: Path, tmp: Path, src_first: bool) -> dict:
    env = cold_env(tmp)
    if src_first:
        env["PYTHONPATH"] = str(tree / "src")
    done = subprocess.run(
        [sys.executable, "-m", "quantgate.cli", "gate", "--results", str(results), "--out", str(out)],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode not in (0, 1):
        raise SystemExit(f"quantgate gate in {tree} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    report = json.loads((out / "report.json").read_text())
    return {"exit": done.returncode, "approvals": report["approvals"], "floors": _floors(report)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, required=True, help="an evaluation directory")
    parser.add_argument("--before", required=True, help="the commit before the change")
    parser.add_argument("--out", type=Path, help="Also write the JSON here.")
    options = parser.parse_args()
    results = options.results.resolve()
    with tempfile.TemporaryDirectory(prefix="quantgate-gate-before-after-") as tmp:
        worktree = Path(tmp) / "before"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(worktree), options.before], cwd=ROOT, check=True
        )
        try:
            before = _gate(worktree, results, Path(tmp) / "b", Path(tmp) / "b-env", True)
            after = _gate(ROOT, results, Path(tmp) / "a", Path(tmp) / "a-env", False)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, check=False)
    changed = differ(before["floors"], after["floors"])
    transitions: dict[str, int] = {}
    for old, new in changed.values():
        transitions[f"{old} -> {new}"] = transitions.get(f"{old} -> {new}", 0) + 1
    result = {
        "command": f"quantgate gate --results {options.results}, --before {options.before} then this checkout",
        "machine": machine(),
        "approvals": {"before": before["approvals"], "after": after["approvals"]},
        "exit": {"before": before["exit"], "after": after["exit"]},
        "statuses_compared": len(after["floors"]),
        "transitions": transitions,
        "differ": changed,
    }
    text = json.dumps(result, indent=2, ensure_ascii=False)
    print(text)
    if options.out:
        options.out.parent.mkdir(parents=True, exist_ok=True)
        options.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
