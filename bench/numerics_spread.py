"""Spread of the gate's bounds under the evaluation-numerics variations one machine can produce.

The same artifact evaluated on another machine may land its bounds a little elsewhere: torch's CPU
reductions split by thread count, kernels differ by instruction set, the fused pass rounds
otherwise, and a batch pads differently. This evaluates one set of artifacts under each variation
here (threads, QUANTGATE_COMPILE, halved batch sizes, AVX2 kernels on an AVX-512 CPU), gates
each, and reports per floor the largest distance between the bounds: ``gates.yaml``'s ``numerics_spread`` takes these figures,
and the gate calls a verdict whose bound sits within that distance of its floor ``marginal``.

    .venv/bin/python bench/numerics_spread.py --checkpoint SRC --artifacts DIR --out OUT [--targets T,..]

Prints JSON: per variant the wall seconds, per (suite, metric) the bounds under each variant and
their spread (max - min, in the floor's units).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUANTGATE = Path(sys.executable).with_name("quantgate")
# every suite the default model's floors can decide (GSM8K and HumanEval carry no power on it and are
# not run: evaluate/skip.py)
SUITES = "wikitext,traffic,long-chain,support-domain"
VARIANTS = {
    "threads-2": {"OMP_NUM_THREADS": "2"},
    "threads-1": {"OMP_NUM_THREADS": "1"},
    "eager": {"OMP_NUM_THREADS": "2", "QUANTGATE_COMPILE": "0"},
    "half-batch": {"OMP_NUM_THREADS": "2", "_half_batch": "1"},
    "avx2": {"OMP_NUM_THREADS": "2", "ATEN_CPU_CAPABILITY": "avx2"},  # another machine's kernels
}


def _project(variant: dict[str, str], where: Path) -> Path:
    """The project root a variant runs in: this checkout, or a copy with halved smoke batch sizes."""
    if not variant.get("_half_batch"):
        return ROOT
    where.mkdir(parents=True, exist_ok=True)
    for name in ("targets", "recipes", "calibration_sets", "eval_suites"):
        shutil.copytree(ROOT / name, where / name, dirs_exist_ok=True)
    shutil.copy(ROOT / "gates.yaml", where / "gates.yaml")
    for spec in (where / "eval_suites").glob("*.yaml"):
        text = spec.read_text()
        spec.write_text(
            re.sub(r"(smoke: \{[^}]*batch_size: )(\d+)", lambda m: m[1] + str(max(1, int(m[2]) // 2)), text)
        )
    return where


def _run(args: list[str], env: dict[str, str]) -> None:
    done = subprocess.run([str(QUANTGATE), *args], check=False, env=env, capture_output=True, text=True)
    if done.returncode not in (0, 1):
        raise SystemExit(f"quantgate {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")


def main() -> None:
    """Evaluate and gate under every variant; print the bounds and their spread."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--artifacts", required=True)
    parser.add_argument("--targets", default="hopper-fp8,rocm-cdna3-fp8,blackwell-nvfp4,draft-int4")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--model-class", default="dense-reasoner")
    parser.add_argument("--suites", default=SUITES)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"of {', '.join(VARIANTS)}")
    opts = parser.parse_args()
    seconds: dict[str, float] = {}
    bounds: dict[str, dict[str, float]] = {}
    chosen = {name: VARIANTS[name] for name in opts.variants.split(",")}
    for name, variant in chosen.items():
        env = {**os.environ, **{k: v for k, v in variant.items() if not k.startswith("_")}}
        env.setdefault(
            "QUANTGATE_DATA", str(ROOT.parent / "shared" / "datasets")
        )  # a copied root has none beside it
        root = _project(variant, opts.out / name / "project")
        start = time.perf_counter()
        evaluated, report = opts.out / name / "eval", opts.out / name / "report"
        common = ["--root", str(root)]
        _run(
            [
                "eval",
                "--checkpoint",
                opts.checkpoint,
                "--artifacts",
                opts.artifacts,
                "--targets",
                opts.targets,
            ]
            # the fixed design: every item, so that a bound's move is the numerics' alone
            + ["--suites", opts.suites, "--fixed", "--out", str(evaluated), *common],
            env,
        )
        seconds[name] = round(time.perf_counter() - start, 1)
        _run(
            [
                "gate",
                "--results",
                str(evaluated),
                "--out",
                str(report),
                "--model-class",
                opts.model_class,
                *common,
            ],
            env,
        )
        for verdict in json.loads((report / "report.json").read_text())["verdicts"]:
            for f in verdict["floors"]:
                if f.get("bound") is not None and f["kind_of_floor"] != "max_regression":
                    key = f"{verdict['artifact']} {f['suite']}.{f['metric']} {f['kind_of_floor']}"
                    bounds.setdefault(key, {})[name] = f["bound"]
    spread = {k: max(v.values()) - min(v.values()) for k, v in bounds.items() if len(v) == len(chosen)}
    per_metric: dict[str, float] = {}
    for key, value in spread.items():
        metric = " ".join(key.split(" ")[1:])
        per_metric[metric] = max(per_metric.get(metric, 0.0), value)
    result = {
        "variants": chosen,
        "suites": opts.suites,
        "seconds": seconds,
        "bounds": bounds,
        "spread": spread,
        "largest_spread_per_floor": per_metric,
    }
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "numerics_spread.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"seconds": seconds, "largest_spread_per_floor": per_metric}, indent=1))


if __name__ == "__main__":
    main()
