"""The README's main job under the fixed and the sequential evaluation design (issue 17).

Usage:  .venv/bin/python bench/run/main_job_designs.py [--order fixed,sequential] [--out F]

Each design runs the README's first command, ``quantgate run --targets <all four>`` with
``--fixed`` or ``--sequential``, as a whole command in its own process and from a cold start,
as on a fresh machine: an empty quantgate cache (the default model converted again, no
evaluation reference), an empty Prefect home, a new output directory and a new local registry.
Both runs are in one benchmark run, one after the other, on the same machine. Printed as JSON:
each design's wall-clock and exit code, every floor's status in both (and any that differ),
and the sequential run's items used, stopping reasons and seconds per (artifact, suite).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cold import cold_env, machine

TARGETS = "hopper-fp8,rocm-cdna3-fp8,blackwell-nvfp4,draft-int4"


def _run(design: str, tmp: Path) -> dict:
    """One cold ``quantgate run`` in ``design``; its wall-clock, exit code and report paths."""
    env = cold_env(tmp)
    (tmp / "registry").mkdir(parents=True)
    out = tmp / "run"
    args = ["run", "--targets", TARGETS, "--out", str(out), f"--{design}"]
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "quantgate.cli", *args], env=env, capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 1):  # 1 is a gate verdict, still a complete run
        raise SystemExit(f"quantgate run --{design} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return {"design": design, "seconds": seconds, "exit": done.returncode, "out": out}


def _floors(report: dict) -> dict[str, str]:
    """``artifact × tenant: suite metric kind`` -> status, and ``artifact × tenant`` -> verdict."""
    found = {}
    for v in report["verdicts"]:
        found[f"{v['artifact']} × {v['tenant']}"] = v["verdict"]
        for f in v["floors"]:
            found[f"{v['artifact']} × {v['tenant']}: {f['suite']} {f['metric']} {f['kind_of_floor']}"] = f[
                "status"
            ]
    return found


def differ(fixed: dict[str, str], sequential: dict[str, str]) -> dict[str, list[str | None]]:
    """The verdicts and floor statuses (``_floors``) that are not the same in both designs."""
    return {
        k: [fixed.get(k), sequential.get(k)]
        for k in sorted(set(fixed) | set(sequential))
        if fixed.get(k) != sequential.get(k)
    }


def _items(out: Path) -> dict[str, dict]:
    """The sequential blocks of every artifact's evaluation: ``artifact/suite`` -> items, reason, seconds."""
    found = {}
    for run_json in sorted((out / "eval-parts").glob("*/run.json")):
        for artifact, suites in (json.loads(run_json.read_text()).get("sequential") or {}).items():
            for suite, d in suites.items():
                found[f"{artifact}/{suite}"] = {
                    k: d[k]
                    for k in ("items_used", "items_total", "stopped", "seconds", "seconds_saved_estimate")
                }
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--order", default="fixed,sequential", help="Designs, in the order they run.")
    parser.add_argument("--out", type=Path, help="Also write the JSON here.")
    options = parser.parse_args()

    runs, floors, items = {}, {}, {}
    for design in options.order.split(","):
        with tempfile.TemporaryDirectory(prefix=f"quantgate-{design}-") as tmp:
            run = _run(design, Path(tmp))
            report = json.loads((run["out"] / "report" / "report.json").read_text())
            floors[design] = _floors(report)
            items[design] = _items(run["out"])
            runs[design] = {
                "seconds": round(run["seconds"], 1),
                "exit": run["exit"],
                "approvals": report["approvals"],
            }
    fixed, sequential = floors.get("fixed", {}), floors.get("sequential", {})
    used = items.get("sequential", {})
    result = {
        "command": f"quantgate run --targets {TARGETS} (--fixed | --sequential), cold cache each",
        "machine": machine(),
        "runs": runs,
        "sequential_over_fixed": (
            round(runs["sequential"]["seconds"] / runs["fixed"]["seconds"], 3) if len(runs) == 2 else None
        ),
        "verdicts_compared": len(fixed),
        "differ": differ(fixed, sequential),
        "text_items": {
            "used": sum(d["items_used"] for d in used.values()),
            "total": sum(d["items_total"] for d in used.values()),
        },
        "sequential_items": used,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if options.out:
        options.out.parent.mkdir(parents=True, exist_ok=True)
        options.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
