"""Canary calibration: how often the watcher's anytime-valid decision errs, looked at every N requests,
against a fixed-horizon Mann-Whitney judge (Kayenta's) looked at the same times.

Usage:  .venv/bin/python bench/fleet/canary_calibration.py [--runs 40] [--looks 40] [--jobs N] [--out F]

``--jobs`` runs the canaries in N processes (each run is seeded, so the figures do not depend on N).

Each cell is a traffic share (1 %, 5 %), a request rate (the requests of one look: rate x 60 s,
all versions together) and a latency shape, light to heavy tails (lognormal sigma 0.3, 0.8, 1.5;
Pareto II, tail index 2.5). Telemetry is simulated (``quantgate.rollout.simulate``: exact bucket
probabilities, a multinomial per look, buckets 2 % apart) and decided by ``quantgate.rollout.decide``
with a tenant policy of p99 TTFT at most 5 % worse than stable and errors at most +0.5 points,
confidence 0.95, no minimum evidence, ``--looks`` looks at most (the maximum duration). Per cell:

- *equal*: the canary is stable's twin; the share of runs rolled back (promise: <= 5 %);
- *at floor*: the canary's p99 is exactly 1.05 x stable's; the share promoted (promise: <= 5 %);
- *10 % slower*: requests until a p99 regression of 10 % is rolled back (median over runs);
- *Mann-Whitney*: the equal canary judged at each look by a one-sided Mann-Whitney U test on the
  same histograms (alpha 0.05, ties by bucket, normal approximation), rolled back at the first
  look it says "worse": the error that grows with repeated looks.

Monte-Carlo error: a share p from R runs has standard error sqrt(p (1 - p) / R), printed per cell.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from scipy import stats

from quantgate.config import RolloutPolicy
from quantgate.rollout import LookState, decide
from quantgate.rollout import simulate as sim

SHAPES = [
    sim.Shape("lognormal", 0.3),
    sim.Shape("lognormal", 0.8),
    sim.Shape("lognormal", 1.5),
    sim.Shape("pareto", 2.5),
]
SHARES = [0.01, 0.05]
RATES = [100, 1000]  # requests per second, all versions; a look every 60 s
POLICY = RolloutPolicy(
    strategy="canary",
    live={"max_p99_increase": 0.05, "max_error_rate_increase": 0.005, "latency_metrics": ["ttft"]},
    minimum={"requests": 1, "replay_pairs": 0},
)
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def mann_whitney_worse(stable, canary, alpha: float = 0.05) -> bool:
    """One-sided Mann-Whitney U (canary larger) from two cumulative histograms of the same buckets."""
    s = np.diff(np.concatenate([[0], stable.cumulative_counts]))
    c = np.diff(np.concatenate([[0], canary.cumulative_counts]))
    n1, n2 = c.sum(), s.sum()
    if n1 == 0 or n2 == 0:
        return False
    below = np.concatenate([[0], np.cumsum(s)[:-1]])
    u = float(np.sum(c * (below + 0.5 * s)))  # pairs (canary, stable) with canary larger, ties half
    t = s + c
    n = n1 + n2
    var = n1 * n2 / 12.0 * ((n + 1) - np.sum(t**3 - t) / (n * (n - 1)))
    z = (u - n1 * n2 / 2.0) / math.sqrt(max(var, 1e-12))
    return bool(stats.norm.sf(z) < alpha)


def run(shape, share, rate, slower, looks, seed, buckets):
    """One canary to its decision: (action, look, canary requests, Mann-Whitney's first 'worse' look)."""
    rng = np.random.default_rng(seed)
    per_look = rate * 60
    state = LookState("c", "s", NOW.isoformat())
    st = ca = None
    mw_look = None
    for look in range(1, looks + 1):
        st = sim.accumulate(
            st,
            sim.telemetry(rng, "s", round(per_look * (1 - share)), shape, buckets, 0.01, metrics=("ttft",)),
        )
        ca = sim.accumulate(
            ca,
            sim.telemetry(rng, "c", round(per_look * share), shape, buckets, 0.01, slower, metrics=("ttft",)),
        )
        if mw_look is None and mann_whitney_worse(st.latency[0], ca.latency[0]):
            mw_look = look
        d = decide(POLICY, 0.95, sim.live(st, ca, str(look)), None, state, NOW)
        if d.action != "continue":
            return d.action, look, ca.requests, mw_look
    return "undecided", looks, ca.requests, mw_look


def _run(task):
    """``run`` over one packed task, for the process pool."""
    return run(*task)


def se(p: float, n: int) -> float:
    """Monte-Carlo standard error of a share."""
    return math.sqrt(max(p * (1 - p), 1e-12) / n)


def main() -> None:
    """Every cell; a table and a JSON of the figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--looks", type=int, default=40)
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="processes (default: every core)"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    buckets = sim.geometric_buckets(0.001, 2000.0, 1.02)
    cells, started = [], time.perf_counter()
    print(
        f"{'shape':14} {'share':>5} {'rate':>5} | {'equal rolled back':>18} | {'at floor promoted':>18} | "
        f"{'10% slower: reqs to detect (detected)':>38} | {'Mann-Whitney equal rolled back':>30}"
    )
    grid = [(shape, share, rate) for shape in SHAPES for share in SHARES for rate in RATES]
    kinds = ((1.0, 10_000), (1.05, 20_000), (1.10, 30_000))  # equal, at the floor, 10 % slower
    tasks = [
        (shape, share, rate, slower, args.looks, base + s, buckets)
        for shape, share, rate in grid
        for slower, base in kinds
        for s in range(args.runs)
    ]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        outcomes = list(pool.map(_run, tasks, chunksize=max(1, len(tasks) // (8 * args.jobs))))
    for index, (shape, share, rate) in enumerate(grid):
        block = outcomes[index * 3 * args.runs : (index + 1) * 3 * args.runs]
        equal, floor, slow = (block[k * args.runs : (k + 1) * args.runs] for k in range(3))
        rb = sum(a == "rollback" for a, *_ in equal) / args.runs
        pr = sum(a == "promote" for a, *_ in floor) / args.runs
        det = [r for a, _, r, _ in slow if a == "rollback"]
        mw = sum(m is not None for *_, m in equal) / args.runs
        cell = {
            "shape": f"{shape.kind} {shape.param:g}",
            "share": share,
            "rate_per_s": rate,
            "equal_rolled_back": rb,
            "equal_rolled_back_se": se(rb, args.runs),
            "equal_promoted": sum(a == "promote" for a, *_ in equal) / args.runs,
            "floor_promoted": pr,
            "floor_promoted_se": se(pr, args.runs),
            "slower10_detected": len(det) / args.runs,
            "slower10_median_canary_requests": statistics.median(det) if det else None,
            "mann_whitney_equal_rolled_back": mw,
            "mann_whitney_se": se(mw, args.runs),
        }
        cells.append(cell)
        med = f"{cell['slower10_median_canary_requests']:,.0f}" if det else "-"
        print(
            f"{cell['shape']:14} {share:>5.0%} {rate:>5} | {rb:>8.1%} ± {se(rb, args.runs):.1%}    | "
            f"{pr:>8.1%} ± {se(pr, args.runs):.1%}    | {med:>20} ({len(det) / args.runs:.0%})"
            f"{'':>10} | {mw:>14.1%} ± {se(mw, args.runs):.1%}",
            flush=True,
        )
    result = {
        "runs": args.runs,
        "looks": args.looks,
        "jobs": args.jobs,
        "seconds": time.perf_counter() - started,
        "machine": platform.processor() or platform.machine(),
        "cells": cells,
    }
    print(f"{args.runs} runs per cell, {args.looks} looks at most, {result['seconds']:.0f} s")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
