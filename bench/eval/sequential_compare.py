"""Fixed against sequential evaluation (issue 17): verdicts and items used, replayed from records.

A sequential evaluation of a text suite scores the same windows as the fixed one, in a seeded
order, a batch at a time; each window's record does not depend on which others share its batch
(teacher-forced, full windows, no padding). So the sequential design can be replayed from a fixed
evaluation's per-item records exactly: the same stopping rule (``evaluate.sequential.run``) with
"scoring" a batch meaning reading its records. This script does that for every artifact and
suite of one or more fixed evaluation directories (merged, the first one's source), gates both
designs with gates.yaml and compares every verdict and floor. Items used stand in for time
(scoring cost is per window); ``quantgate eval --sequential`` measures the wall-clock itself.

    .venv/bin/python bench/eval/sequential_compare.py --eval runs/eval [--eval more/eval] --out /tmp/seq-compare
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def resample(eval_dir: Path, sizes: dict[str, int], seed: int = 0) -> None:
    """Grow (or shrink) each named suite to ``sizes[suite]`` items drawn with replacement from its
    records, the same draws for the source and every artifact (pairs stay pairs): a projection of
    a larger profile from a smaller one's windows, for items used, not a measurement."""
    for suite, n in sizes.items():
        src_path = eval_dir / "source" / f"{suite}.json"
        source = json.loads(src_path.read_text())
        ids = [str(r["item"]) for r in source["samples"]]
        draw = np.random.default_rng(seed).integers(0, len(ids), n)
        for path in eval_dir.glob(f"*/{suite}.json"):
            record = json.loads(path.read_text())
            by_item = {str(r["item"]): r for r in record["samples"]}
            record["samples"] = [{**by_item[ids[j]], "item": k} for k, j in enumerate(draw)]
            path.write_text(json.dumps(record))


def replay(fixed: Path, out: Path) -> dict:
    """Write ``out``: ``fixed`` with every subset-capable suite of every artifact replayed sequentially."""
    from quantgate.config.gates import load_gates
    from quantgate.config.targets import Catalog
    from quantgate.evaluate.sequential import BATCH_MIN, watched
    from quantgate.evaluate.sequential import run as sequential_run
    from quantgate.evaluate.suites import SuiteKind, SuiteResult, load_suites

    gates = load_gates(ROOT / "gates.yaml", Catalog(ROOT))
    suites = {s.spec.name: s for s in load_suites(ROOT / "eval_suites")}
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(fixed, out)
    profile = json.loads((fixed / "run.json").read_text())["profile"]
    designs: dict = {}
    for model_dir in sorted(p for p in out.iterdir() if p.is_dir() and p.name != "source"):
        for path in sorted(model_dir.glob("*.json")):
            suite = suites.get(path.stem)
            if suite is None or type(suite.runner).subset is SuiteKind.subset:
                continue  # this kind runs every item in both designs
            record = json.loads(path.read_text())
            source = json.loads((out / "source" / path.name).read_text())
            src = SuiteResult(source["suite"], source["kind"], source["metrics"], source["samples"])
            by_item = {str(r["item"]): r for r in record["samples"]}
            ids = [str(r["item"]) for r in source["samples"]]
            watches = watched(gates, suite.spec.name, model_dir.name)
            if not watches:
                continue
            batch = max(BATCH_MIN, int(getattr(suite.spec.sizes(profile), "batch_size", 1)))
            samples, design = sequential_run(
                suite,
                src,
                watches,
                len(ids),
                lambda pos, by_item=by_item, ids=ids: [by_item[ids[i]] for i in pos],
                batch=batch,
            )
            for key in ("seconds", "seconds_all_estimate", "seconds_saved_estimate"):
                design.pop(key)  # replayed: no time was spent
            record["samples"], record["sequential"] = samples, design
            path.write_text(json.dumps(record))
            designs.setdefault(model_dir.name, {})[suite.spec.name] = design
    return designs


def verdicts(eval_dir: Path) -> tuple[dict, dict]:
    """The gate's verdicts and floor statuses for ``eval_dir``, keyed by artifact/tenant(/floor)."""
    from quantgate.gate.run import gate_results

    report = gate_results(eval_dir, ROOT / "gates.yaml", ROOT)
    return (
        {f"{v.artifact}/{v.tenant}": v.verdict for v in report.verdicts},
        {
            f"{v.artifact}/{v.tenant}/{f.suite}.{f.metric}.{f.kind_of_floor}": f.status
            for v in report.verdicts
            for f in v.floors
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--eval", type=Path, action="append", required=True, help="fixed evaluation dirs")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--resample",
        default="",
        help="suite=N,...: project to N items per suite by drawing windows with replacement (e.g. the full "
        "profile's wikitext=128,traffic=64)",
    )
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    fixed = out / "fixed"
    if len(args.eval) > 1:
        from quantgate.evaluate.merge import merge_evaluations

        merge_evaluations(args.eval, fixed)  # refuses parts of another source, profile or suites
    else:
        if fixed.exists():
            shutil.rmtree(fixed)
        shutil.copytree(args.eval[0], fixed)
    if args.resample:
        resample(fixed, {k: int(v) for k, v in (p.split("=") for p in args.resample.split(","))})
    designs = replay(fixed, out / "sequential")
    fixed_v, fixed_f = verdicts(fixed)
    seq_v, seq_f = verdicts(out / "sequential")
    result = {
        "verdicts_identical": fixed_v == seq_v,
        "verdict_differences": {k: (fixed_v[k], seq_v.get(k)) for k in fixed_v if fixed_v[k] != seq_v.get(k)},
        "floor_differences": {k: (fixed_f[k], seq_f.get(k)) for k in fixed_f if fixed_f[k] != seq_f.get(k)},
        "verdicts": {"fixed": fixed_v, "sequential": seq_v},
        "sequential": designs,
    }
    (out / "compare.json").write_text(json.dumps(result, indent=1))
    used = total = 0
    print(f"{'artifact':20} {'suite':9} {'items':>7}  stopped")
    for model, by_suite in designs.items():
        for suite, d in by_suite.items():
            used, total = used + d["items_used"], total + d["items_total"]
            print(f"{model:20} {suite:9} {d['items_used']:>3}/{d['items_total']:<3}  {d['stopped']}")
    print(f"items used: {used} of {total}; verdicts identical: {result['verdicts_identical']}")
    for k, v in {**result["verdict_differences"], **result["floor_differences"]}.items():
        print(f"  differs: {k}: fixed {v[0]}, sequential {v[1]}")


if __name__ == "__main__":
    main()
