"""A re-run of ``quantgate run`` with unchanged inputs against the cold run it repeats.

Usage:  .venv/bin/python bench/run/rerun.py [--targets T,..] [--suites S,..] [--repeats 3] [--out F]

Each repeat starts cold — an empty quantgate cache (so the default model is converted again
and no evaluation reference exists), an empty Prefect home (no task results to reuse), a new
output directory and a new local registry — runs ``quantgate run`` once (the anchor), then
again with nothing changed (the re-run, every heavy task served from Prefect's cache). Both
are whole commands in their own processes, as a user runs them, ephemeral Prefect API
included. Medians over the repeats and the ratio re-run / cold are printed as JSON. The
defaults (every target, wikitext and traffic only) keep a repeat to a few minutes on 2 cores;
``--suites`` with every suite measures the README's whole main job.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cold import cold_env, machine


def _run(args: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "quantgate.cli", "run", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 1):  # 1 is a gate verdict, still a complete run
        raise SystemExit(f"quantgate run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="hopper-fp8,rocm-cdna3-fp8,blackwell-nvfp4,draft-int4")
    parser.add_argument("--suites", default="wikitext,traffic")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    options = parser.parse_args()

    cold, warm = [], []
    for _ in range(options.repeats):
        with tempfile.TemporaryDirectory(prefix="quantgate-rerun-") as tmp:
            tmp = Path(tmp)
            env = cold_env(tmp)
            args = ["--targets", options.targets, "--suites", options.suites, "--out", str(tmp / "run")]
            cold.append(_run(args, env))
            warm.append(_run(args, env))
    result = {
        "command": f"quantgate run --targets {options.targets} --suites {options.suites}",
        "machine": machine(),
        "cold_s": cold,
        "rerun_s": warm,
        "cold_median_s": statistics.median(cold),
        "rerun_median_s": statistics.median(warm),
        "rerun_over_cold": statistics.median(warm) / statistics.median(cold),
    }
    text = json.dumps(result, indent=1)
    print(text)
    if options.out:
        options.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
