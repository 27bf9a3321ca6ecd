"""``quantgate eval`` of some artifacts under both designs, measured: wall-clock, items, verdicts.

Usage:
    .venv/bin/python bench/eval/eval_designs.py --artifacts A --targets T[,..] [--profile full]
        [--suites wikitext] --work W [--out F]

For each target, ``quantgate eval --fixed`` then ``quantgate eval --sequential`` (each its own
process, the source's reference from the cache, so both pay only the artifact's loading and
scoring), each gated with gates.yaml (``quantgate gate``); printed as JSON: per target and
design the wall-clock, the items used per suite, and every floor's status, with the floors whose
status differs between the designs. Unlike ``sequential_compare.py`` (a replay from records),
both designs really run here. Run it alone: on 2 cores a second job skews every figure.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

# the cold environment and the verdict comparison of the run benchmarks (bench/run/)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "run"))

from cold import machine
from main_job_designs import _floors, differ


def _quantgate(*args: str) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "quantgate.cli", *args], capture_output=True, text=True, check=False
    )
    return time.perf_counter() - start, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifacts", type=Path, required=True)
    parser.add_argument("--targets", required=True)
    parser.add_argument("--profile", default="full")
    parser.add_argument("--suites", default="wikitext")
    parser.add_argument(
        "--work", type=Path, required=True, help="Where each evaluation and report is written."
    )
    parser.add_argument("--out", type=Path, help="Also write the JSON here.")
    options = parser.parse_args()

    result: dict = {
        "command": f"quantgate eval --profile {options.profile} --suites {options.suites} (--fixed | --sequential)",
        "machine": machine(),
        "targets": {},
    }
    for target in options.targets.split(","):
        row: dict = {}
        floors = {}
        for design in ("fixed", "sequential"):
            out, report = options.work / f"{design}-{target}", options.work / f"{design}-{target}-report"
            seconds, done = _quantgate(
                "eval", "--artifacts", str(options.artifacts), "--targets", target, "--profile", options.profile,
                "--suites", options.suites, "--out", str(out), f"--{design}",
            )  # fmt: skip
            if done.returncode != 0:
                raise SystemExit(
                    f"eval --{design} {target} failed ({done.returncode}):\n{done.stderr[-3000:]}"
                )
            _quantgate("gate", "--results", str(out), "--out", str(report))
            floors[design] = _floors(json.loads((report / "report.json").read_text()))
            blocks = (json.loads((out / "run.json").read_text()).get("sequential") or {}).get(target, {})
            row[design] = {
                "seconds": round(seconds, 1),
                "items": {
                    s: f"{d['items_used']} of {d['items_total']} ({d['stopped']})" for s, d in blocks.items()
                },
            }
        fixed, sequential = floors["fixed"], floors["sequential"]
        row["floors_compared"] = len(fixed)
        row["differ"] = differ(fixed, sequential)
        row["verdicts"] = {k: v for k, v in sequential.items() if ":" not in k}
        row["sequential_over_fixed"] = round(row["sequential"]["seconds"] / row["fixed"]["seconds"], 3)
        result["targets"][target] = row
        print(json.dumps({target: row}, indent=2), flush=True)
    if options.out:
        options.out.parent.mkdir(parents=True, exist_ok=True)
        options.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
