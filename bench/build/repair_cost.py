"""What a repair search cost against building and evaluating every k, from its repair.json.

    python bench/build/repair_cost.py RUN/repair/repair.json [--out FILE]

The search's own figures (seconds, builds and evaluations, sensitivity) are measured by
``quantgate repair`` and read here; building and evaluating every k from 1 to n (what a search
without bisection would do to find the smallest passing variant for sure) is estimated as n
times the mean seconds of the variants the search did build and evaluate, plus the same
sensitivity pass (the ranking is needed either way). Prints JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def cost(repair_json: Path) -> dict:
    """Per target: the search's cost and the estimated cost of every k."""
    outcome = json.loads(repair_json.read_text())
    rows = {}
    for t in outcome["targets"]:
        probes = t["probes"]
        mean = sum(p["seconds"] for p in probes) / len(probes) if probes else 0.0
        every_k = t["units"] * mean + t["sensitivity_seconds"]
        rows[t["target"]] = {
            "units": t["units"],
            "builds_and_evaluations": len(probes),
            "budget": t["budget"],
            "sensitivity_seconds": t["sensitivity_seconds"],
            "sensitivity_cached": t["sensitivity_cached"],
            "search_seconds": t["seconds"],
            "mean_variant_seconds": round(mean, 1),
            "every_k_seconds_estimate": round(every_k, 1),
            "ratio": round(t["seconds"] / every_k, 3) if every_k else None,
            "chosen": {x["tenant"]: x["k"] for x in t["tenants"]},
            "variants": [{"k": p["k"], "bytes": p["bytes"], "passed": p["passed"]} for p in probes],
        }
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repair_json", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    text = json.dumps(cost(args.repair_json), indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
