"""All calibrated targets from one ``quantgate build`` against one build per target.

Usage:  .venv/bin/python bench/build/build_calibrated.py [--targets blackwell-nvfp4,draft-int4] [--repeats 3] [--out F]

On the embedded default model (SmolLM2-135M, converted once into the cache), alternating
across ``--repeats`` rounds, each a fresh ``quantgate build`` process as a user runs it:
every calibrated target alone, then all of them in one process. Reported: the medians, the
ratio of the joint build to the slowest single target (issue 7: at most 1.3x), peak RSS (the
child's ``VmHWM``, polled from outside), and the per-target seconds each manifest records, which
show where the joint run's time goes. ``--parallel`` adds one more configuration: the single-target
builds started at the same time, each with one torch thread (``OMP_NUM_THREADS=1``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from quantgate.runtime.units import GB


def _run(argvs: list[list[str]], env: dict[str, str] | None = None) -> tuple[float, int]:
    """Wall seconds until every process has exited, and the sum of their peak RSS."""
    from quantgate.runtime.memory import peak_rss_bytes

    with contextlib.ExitStack() as stack:
        errs = [stack.enter_context(tempfile.TemporaryFile("w+")) for _ in argvs]
        started = time.perf_counter()
        procs = [
            subprocess.Popen(a, stdout=subprocess.DEVNULL, stderr=e, env={**os.environ, **(env or {})})
            for a, e in zip(argvs, errs, strict=True)
        ]
        peaks = [0] * len(procs)
        while any(p.poll() is None for p in procs):
            peaks = [max(peak, peak_rss_bytes(p.pid) or 0) for peak, p in zip(peaks, procs, strict=True)]
            time.sleep(0.05)
        seconds = time.perf_counter() - started
        for argv, proc, err in zip(argvs, procs, errs, strict=True):
            err.seek(0)
            if proc.returncode:
                raise SystemExit(f"{argv} failed ({proc.returncode}):\n{err.read()[-3000:]}")
    return seconds, sum(peaks)


def _manifest_seconds(out: Path) -> dict[str, float]:
    from quantgate.contracts.artifact import read_manifest

    return {p.name: read_manifest(p).build.seconds for p in sorted(out.iterdir()) if read_manifest(p)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="blackwell-nvfp4,draft-int4")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--parallel",
        action="store_true",
        help="also run the single-target builds at the same time, one torch thread each",
    )
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args()

    from quantgate.config import cache_dir
    from quantgate.embedded.smollm2 import default_checkpoint

    checkpoint = default_checkpoint(cache_dir())
    targets = args.targets.split(",")
    configs = [[t] for t in targets] + [targets] + ([["parallel", *targets]] if args.parallel else [])
    runs: dict[str, list[dict[str, object]]] = {",".join(c): [] for c in configs}
    with tempfile.TemporaryDirectory(prefix="quantgate-bench-calibrated-") as tmp:
        for round_ in range(args.repeats):
            for config in configs if round_ % 2 == 0 else configs[::-1]:
                key = ",".join(config)
                out = Path(tmp) / f"r{round_}-{len(config)}-{config[0]}"
                argv = [sys.executable, "-m", "quantgate.cli", "build", "--checkpoint", str(checkpoint)]
                if config[0] == "parallel":  # one process per target, started together
                    argvs = [[*argv, "--targets", t, "--out", str(out)] for t in config[1:]]
                    seconds, peak = _run(argvs, {"OMP_NUM_THREADS": "1"})
                else:
                    seconds, peak = _run([[*argv, "--targets", key, "--out", str(out)]])
                runs[key].append(
                    {"seconds": seconds, "peak_rss_bytes": peak, "per_target_s": _manifest_seconds(out)}
                )
                print(
                    f"round {round_ + 1} {key}: {seconds:.1f} s, peak {peak / GB:.2f} GB, "
                    f"per target {runs[key][-1]['per_target_s']}",
                    file=sys.stderr,
                )

    summary = {
        key: {
            "median_s": statistics.median(r["seconds"] for r in rs),
            "median_peak_rss_GB": statistics.median(r["peak_rss_bytes"] for r in rs) / GB,
            "runs_s": [round(r["seconds"], 1) for r in rs],
            "per_target_s": [r["per_target_s"] for r in rs],
        }
        for key, rs in runs.items()
    }
    slowest_single = max(summary[t]["median_s"] for t in targets)
    joint = summary[",".join(targets)]["median_s"]
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_average_at_end": os.getloadavg(),
        "checkpoint": str(checkpoint),
        "builds": summary,
        "joint_vs_slowest_single": joint / slowest_single,
        "joint_vs_sum_of_singles": joint / sum(summary[t]["median_s"] for t in targets),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
