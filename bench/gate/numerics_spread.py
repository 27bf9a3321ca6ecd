"""Spread of the gate's bounds under the evaluation-numerics variations one machine can produce.

The same artifact evaluated on another machine may land its bounds a little elsewhere: torch's CPU
reductions split by thread count, kernels differ by instruction set, the fused pass rounds
otherwise, and a batch pads differently. This evaluates one set of artifacts under each variation
here (threads, QUANTGATE_COMPILE, halved batch sizes, AVX2 kernels on an AVX-512 CPU) and, on a
GPU worker, on the GPU (native FP8 where the GPU computes it, the emulation on the GPU elsewhere) and
on that machine's CPU, gates each, and reports per floor the largest distance between the bounds:
``gates.yaml``'s ``numerics_spread`` takes these figures, and the gate calls a verdict whose bound
sits within that distance of its floor ``marginal``.

    .venv/bin/python bench/gate/numerics_spread.py --checkpoint SRC --artifacts DIR --out OUT [--targets T,..]
    python3 bench/gate/numerics_spread.py --merge A/numerics_spread.json B/numerics_spread.json --out OUT
    .venv/bin/python bench/gate/numerics_spread.py --evaluated cuda=DIR cpu=DIR --hashes H.json --out OUT

``--merge`` joins the runs of several machines: a floor's bounds are compared across machines only
for an artifact whose weights are the same bytes on both (each safetensors file's sha256), so a
spread is the numerics' alone, never a different build's.

Prints JSON: per variant the wall seconds, per (suite, metric) the bounds under each variant and
their spread (max - min, in the floor's units).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUANTGATE = Path(sys.executable).with_name("quantgate")
# every suite the default model's floors can decide (GSM8K and HumanEval carry no power on it and are
# not run: evaluate/skip.py)
SUITES = "wikitext,traffic,long-chain,support-domain"
# ``_device`` is quantgate's --device (cpu unless named: ``auto`` would take a GPU where there is one)
VARIANTS = {
    "cuda": {"_device": "cuda"},  # native FP8 where this GPU computes it, the emulation on it elsewhere
    "cpu": {"_device": "cpu"},  # this machine's CPU on all its cores (a GPU worker's host CPU)
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


def _machine() -> dict[str, str]:
    """Which CPU (and GPU) a run's bounds come from: the platforms a merged spread spans."""
    cpu = platform.processor()
    try:
        names = [ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name")]
        cpu = names[0].split(":", 1)[1].strip() if names else cpu
    except OSError:
        pass
    out = {"cpu": cpu, "cores": str(os.cpu_count())}
    try:
        import torch

        out["torch"] = torch.__version__
        if torch.cuda.is_available():
            out["gpu"] = torch.cuda.get_device_name()
    except ImportError:
        pass
    return out


def _identities(artifacts: Path, targets: list[str]) -> dict[str, str]:
    """Per target, one hash of its artifact's weights (the manifest's sha256 of each safetensors
    file; manifest.json itself differs by the build's times and device)."""
    out = {}
    for target in targets:
        manifest = artifacts / target / "manifest.json"
        if manifest.exists():
            files = json.loads(manifest.read_text())["files"]
            out[target] = _weights_digest({k: v["sha256"] for k, v in files.items()})
    return out


def _weights_digest(sha256_by_file: dict[str, str]) -> str:
    weights = {k: v for k, v in sorted(sha256_by_file.items()) if k.endswith(".safetensors")}
    return hashlib.sha256(json.dumps(weights).encode()).hexdigest()[:16]


def _hashed_identities(hashes: Path) -> dict[str, str]:
    """``_identities`` from ``bench/gpu/gpu_numerics.py hashes`` of artifact directories (another
    machine's builds, whose manifests did not travel)."""
    return {Path(d).name: _weights_digest(files) for d, files in json.loads(hashes.read_text()).items()}


def _gated_bounds(
    evaluated: Path, report: Path, model_class: str, common: list[str], env
) -> dict[str, float]:
    """Every floor's bound (regression floors aside) of ``quantgate gate`` on one evaluation."""
    _run(
        ["gate", "--results", str(evaluated), "--out", str(report), "--model-class", model_class, *common],
        env,
    )
    bounds = {}
    for verdict in json.loads((report / "report.json").read_text())["verdicts"]:
        for f in verdict["floors"]:
            if f.get("bound") is not None and f["kind_of_floor"] != "max_regression":
                bounds[f"{verdict['artifact']} {f['suite']}.{f['metric']} {f['kind_of_floor']}"] = f["bound"]
    return bounds


def disagreements(reports: dict[str, Path]) -> dict:
    """Floors the runs decided differently (pass against fail) and whether every run marked them
    marginal: the gate's promise is that two platforms agree or say that they may not."""
    statuses: dict[str, dict[str, tuple[str, bool]]] = {}
    for name, report in reports.items():
        for v in json.loads((report / "report.json").read_text())["verdicts"]:
            for f in v["floors"]:
                key = f"{v['artifact']} x {v['tenant']}: {f['suite']}.{f['metric']} {f['kind_of_floor']} {f['floor']}"
                statuses.setdefault(key, {})[name] = (f["status"], bool(f.get("marginal")))
    differ = {
        k: {n: {"status": s, "marginal": m} for n, (s, m) in by.items()}
        for k, by in statuses.items()
        if len({s for s, _ in by.values()} & {"pass", "fail"}) > 1
    }
    unmarked = sorted(k for k, by in differ.items() if not all(x["marginal"] for x in by.values()))
    return {"floors": len(statuses), "decided_differently": differ, "not_marked_marginal": unmarked}


def _spreads(bounds: dict[str, dict[str, float]], variants: int) -> tuple[dict, dict]:
    """Per floor the spread of its bound over the variants that bounded it in all of them, and
    per (suite.metric, floor kind) the largest over artifacts."""
    spread = {k: max(v.values()) - min(v.values()) for k, v in bounds.items() if len(v) == variants}
    per_metric: dict[str, float] = {}
    for key, value in spread.items():
        metric = " ".join(key.split(" ")[1:])
        per_metric[metric] = max(per_metric.get(metric, 0.0), value)
    return spread, per_metric


def merge(paths: list[Path]) -> dict:
    """Several machines' runs as one: each variant renamed ``<machine label>:<variant>``; a floor
    joins only for an artifact whose bytes were the same in every run that has it."""
    runs = [json.loads(p.read_text()) for p in paths]
    labels = [r.get("label") or p.parent.name for r, p in zip(runs, paths, strict=True)]
    same: dict[str, bool] = {}
    for r in runs:
        for target, digest in r.get("artifacts", {}).items():
            first = next(x["artifacts"][target] for x in runs if target in x.get("artifacts", {}))
            same[target] = same.get(target, True) and digest == first
    bounds: dict[str, dict[str, float]] = {}
    variants = 0
    for label, r in zip(labels, runs, strict=True):
        variants += len(r["variants"])
        for key, by_variant in r["bounds"].items():
            if same.get(key.split(" ")[0], False):
                for name, bound in by_variant.items():
                    bounds.setdefault(key, {})[f"{label}:{name}"] = bound
    spread, per_metric = _spreads(bounds, variants)
    return {
        "merged": [str(p) for p in paths],
        "machines": {label: r.get("machine") for label, r in zip(labels, runs, strict=True)},
        "same_bytes": same,
        "bounds": bounds,
        "spread": spread,
        "largest_spread_per_floor": per_metric,
    }


def _write(out: Path, result: dict, *shown: str) -> None:
    """``<out>/numerics_spread.json``, and the keys ``shown`` printed."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "numerics_spread.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in shown}, indent=1))


def _run(args: list[str], env: dict[str, str], ok: tuple[int, ...] = (0, 1)) -> None:
    command = [str(QUANTGATE)] if QUANTGATE.exists() else [sys.executable, "-m", "quantgate.cli"]
    done = subprocess.run([*command, *args], check=False, env=env, capture_output=True, text=True)
    if done.returncode not in ok:
        raise SystemExit(f"quantgate {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")


def main() -> None:
    """Evaluate and gate under every variant; print the bounds and their spread."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint")
    parser.add_argument("--artifacts")
    parser.add_argument(
        "--label", default=None, help="this machine's name in a merge (default: the out dir's)"
    )
    parser.add_argument(
        "--merge", type=Path, nargs="+", default=None, help="numerics_spread.json of several runs"
    )
    parser.add_argument(
        "--evaluated", nargs="+", default=None, metavar="NAME=DIR",
        help="evaluations made elsewhere (quantgate eval --fixed --out DIR), gated here as variants",
    )  # fmt: skip
    parser.add_argument("--hashes", type=Path, default=None, help="gpu_numerics.py hashes of their artifacts")
    parser.add_argument("--targets", default="hopper-fp8,rocm-cdna3-fp8,blackwell-nvfp4,draft-int4")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--model-class", default="dense-reasoner")
    parser.add_argument("--suites", default=SUITES)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"of {', '.join(VARIANTS)}")
    opts = parser.parse_args()
    if opts.merge:
        _write(opts.out, merge(opts.merge), "same_bytes", "largest_spread_per_floor")
        return
    seconds: dict[str, float] = {}
    bounds: dict[str, dict[str, float]] = {}
    if opts.evaluated:  # another machine's evaluations, gated here (the gate's arithmetic is exact)
        if opts.hashes is None:
            parser.error("--evaluated needs --hashes: which artifact bytes those evaluations scored")
        runs = dict(item.split("=", 1) for item in opts.evaluated)
        for name, evaluated in runs.items():
            report = opts.out / name / "report"
            for key, bound in _gated_bounds(
                Path(evaluated), report, opts.model_class, [], os.environ
            ).items():
                bounds.setdefault(key, {})[name] = bound
        spread, per_metric = _spreads(bounds, len(runs))
        agreement = disagreements({name: opts.out / name / "report" for name in runs})
        result = {
            "agreement": agreement,
            "label": opts.label or opts.out.name,
            "machine": {
                name: json.loads((Path(d) / "run.json").read_text())["environment"]
                for name, d in runs.items()
            },
            "artifacts": _hashed_identities(opts.hashes),
            "variants": {name: {"evaluated": d} for name, d in runs.items()},
            "bounds": bounds,
            "spread": spread,
            "largest_spread_per_floor": per_metric,
        }
        _write(opts.out, result, "largest_spread_per_floor", "agreement")
        return
    if not (opts.checkpoint and opts.artifacts):
        parser.error("--checkpoint and --artifacts are required (or --merge, or --evaluated)")
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
                "--device",
                variant.get("_device", "cpu"),
            ]
            # the fixed design: every item, so that a bound's move is the numerics' alone
            + ["--suites", opts.suites, "--fixed", "--out", str(evaluated), *common],
            env,
            ok=(0,),  # eval exits 0 or fails; 1 is a gate's verdict, from eval a crash
        )
        seconds[name] = round(time.perf_counter() - start, 1)
        for key, bound in _gated_bounds(evaluated, report, opts.model_class, common, env).items():
            bounds.setdefault(key, {})[name] = bound
    spread, per_metric = _spreads(bounds, len(chosen))
    result = {
        "label": opts.label or opts.out.name,
        "machine": _machine(),
        "artifacts": _identities(Path(opts.artifacts), opts.targets.split(",")),
        "variants": chosen,
        "suites": opts.suites,
        "seconds": seconds,
        "bounds": bounds,
        "spread": spread,
        "largest_spread_per_floor": per_metric,
    }
    _write(opts.out, result, "seconds", "largest_spread_per_floor")


if __name__ == "__main__":
    main()
