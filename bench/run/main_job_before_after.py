"""The README's main job before and after a change, in one benchmark run (issue 24).

Usage:  .venv/bin/python bench/run/main_job_before_after.py --before COMMIT [--after COMMIT] [--out F]

Runs the README's first command, ``quantgate run --targets <all four>``, twice, one after the other
on this machine, each as a whole command in its own process from a cold start (``cold.cold_env``:
an empty quantgate cache, Prefect home, output directory and local registry): first the tree at
``--before`` (a git worktree made for the run, its ``src`` first on PYTHONPATH, this checkout's
virtual environment), then this checkout (or the tree at ``--after``, so that edits made while it runs do not leak into
the run). Printed as JSON: each run's wall-clock, exit code and
evaluation seconds (the ``eval-*`` steps, from the flow's own task log lines), every verdict and
floor status in both, the ones that differ, and the suites the after run did not evaluate.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from cold import cold_env, machine
from main_job_designs import TARGETS, _floors, differ

ROOT = Path(__file__).resolve().parents[2]
# "12:34:56.789 | INFO    | Task run 'eval-hopper-fp8' - ..." : the step's first and last line
STEP = re.compile(r"^(\d\d:\d\d:\d\d\.\d+) \| \w+\s+\| Task run '([\w.-]+?)(?:-\d+)?' - (.*)$")


def _step_seconds(log: str) -> dict[str, float]:
    """Seconds from each task's first to its last log line, by task name."""
    seen: dict[str, list[datetime]] = {}
    for line in log.splitlines():
        m = STEP.match(line.strip())
        if m:
            seen.setdefault(m[2], []).append(datetime.strptime(m[1], "%H:%M:%S.%f"))
    return {name: (max(t) - min(t)).total_seconds() for name, t in seen.items()}


def _tokens_scored(eval_dir: Path) -> dict[str, int]:
    """Teacher-forced positions scored per suite, over the source and every artifact (text windows'
    ``tokens``, long chains' ``trace_tokens``), from the records the run wrote."""
    totals: dict[str, int] = {}
    for path in sorted(eval_dir.glob("*/*.json")):
        try:
            samples = json.loads(path.read_text()).get("samples", [])
        except (OSError, ValueError):
            continue
        scored = sum(
            int(r.get("tokens", r.get("trace_tokens", 0)) or 0) for r in samples if isinstance(r, dict)
        )
        if scored:
            totals[path.stem] = totals.get(path.stem, 0) + scored
    return totals


def _eval_seconds(out: Path) -> float:
    """The evaluations' own seconds (loading, the source's references, scoring), from each
    evaluation step's ``run.json``: the console's wording changes between trees, these records do not."""
    total = 0.0
    for path in sorted(out.glob("eval-parts/*/run.json")):
        try:
            per_model = json.loads(path.read_text()).get("seconds") or {}
        except (OSError, ValueError):
            continue
        total += sum(float(v) for phases in per_model.values() for v in phases.values())
    return round(total, 1)


def _run(tree: Path, src_first: bool, tmp: Path) -> dict:
    env = cold_env(tmp)
    env["QUANTGATE_DATA"] = env.get("QUANTGATE_DATA", str(ROOT.parent / "shared" / "datasets"))
    env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "180"
    if src_first:
        env["PYTHONPATH"] = str(tree / "src")
    (tmp / "registry").mkdir(parents=True)
    out = tmp / "run"
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "quantgate.cli", "run", "--targets", TARGETS, "--out", str(out)],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"quantgate run in {tree} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    steps = _step_seconds(done.stdout + "\n" + done.stderr)
    report = json.loads((out / "report" / "report.json").read_text())
    return {
        "seconds": round(seconds, 1),
        "exit": done.returncode,
        "eval_seconds": _eval_seconds(out),
        "tokens_scored": _tokens_scored(out / "eval"),
        "steps": {k: round(v, 1) for k, v in sorted(steps.items())},
        "floors": _floors(report),
        "approvals": report["approvals"],
        "skipped": report.get("skipped", {}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the commit before the change")
    parser.add_argument("--after", default=None, help="the commit after it (default: this checkout)")
    parser.add_argument("--out", type=Path, help="Also write the JSON here.")
    options = parser.parse_args()
    runs = {}
    with tempfile.TemporaryDirectory(prefix="quantgate-before-after-") as tmp:
        trees = {"before": Path(tmp) / "before", "after": Path(tmp) / "after"}
        commits = {"before": options.before, "after": options.after}
        made = []
        try:
            for name, commit in commits.items():
                if commit is None:
                    trees[name] = ROOT
                    continue
                subprocess.run(
                    ["git", "worktree", "add", "--detach", str(trees[name]), commit], cwd=ROOT, check=True
                )
                made.append(trees[name])
            runs["before"] = _run(trees["before"], True, Path(tmp) / "b")
            runs["after"] = _run(trees["after"], options.after is not None, Path(tmp) / "a")
        finally:
            for tree in made:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
    result = {
        "command": f"quantgate run --targets {TARGETS}, cold cache each, --before {options.before} "
        f"then {options.after or 'this checkout'}",
        "head": subprocess.run(
            ["git", "rev-parse", options.after or "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip(),
        "machine": machine() | {"load_average_1m": os.getloadavg()[0]},
        "runs": {k: {key: v for key, v in r.items() if key != "floors"} for k, r in runs.items()},
        "verdicts_compared": len(runs["after"]["floors"]),
        "differ": differ(runs["before"]["floors"], runs["after"]["floors"]),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if options.out:
        options.out.parent.mkdir(parents=True, exist_ok=True)
        options.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
