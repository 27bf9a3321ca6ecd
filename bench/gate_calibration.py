"""Gate calibration (issue 24): how often each floor kind passes an artifact whose true value sits
exactly at the floor (false pass), and how often it passes or fails at other true values (power),
by simulation through the gate's own code, under both evaluation designs.

Usage:
  .venv/bin/python bench/gate_calibration.py [--runs 2000] [--records E] [--workers 2] [--out F]
                                             [--kinds a,b] [--n 4,8,16,32,128] [--truths floor,half]
  PYTHONPATH=<old tree>/src .venv/bin/python bench/gate_calibration.py --gate before ...

Every cell draws ``--runs`` evaluations of n items from a finite population whose true value is
known exactly (the floor, or 0, 1/2 or 2x the floor's tolerance away from no change), writes them
as the per-item records a suite writes, and decides the floor as the gate does:

- ``--gate new`` (this tree): the population's records become the suite's own columns once
  (``SuiteKind.columns``); each run resamples rows and decides as the gate does: the fixed design
  is ``floor.plan`` -> ``floor.measure`` -> ``floor.decide``, exactly what ``evaluate_floor``
  composes, without the reported ends a decision does not need; the sequential design runs
  ``sequence.linearize`` and ``sequence.decide`` (what ``sequence.check`` runs) after every batch
  of 4 items and stops at the first decision, else decides on every item at
  ``sequence.final_confidence``.
- ``--gate before`` (an older tree on PYTHONPATH): its ``evaluate_floor`` on the records, and its
  ``sequence.check`` the same way, for the grid before this change.

Per-item shapes: ``real`` (resampled from the default model's records of a smoke evaluation,
``--records``, rescaled to the true value), ``skewed`` (gamma, shape 2), ``heavy`` (lognormal,
sigma 1), and for events ``0/1`` at floor rates 0.02-0.5. A false-pass rate is reported with its
Monte-Carlo error, sqrt(p (1 - p) / runs); the goal is every one <= 1 - c plus that error (5.5 %
at c = 0.95). Printed and written (``--out``) as JSON: one row per cell.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CONFIDENCE = 0.95
BATCH = 4
POP = 20_000  # population size for synthetic shapes (windows, traces or items)
TOKENS = 511  # tokens per text window at smoke (512-token windows, 511 scored)
KEEP = 660  # largest per-token values kept per window: enough for the pooled p99 of up to 128 windows
TRUTHS = ("floor", "none", "half", "double")
GRID_N = (4, 8, 16, 32, 128)


def _unit(base: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """``base`` rescaled to a (weighted) mean of 1."""
    w = np.ones_like(base) if weights is None else weights
    return base * (np.sum(w) / np.sum(base * w))


def _clipped_mean(base: np.ndarray, target: float, weights: np.ndarray) -> np.ndarray:
    """``s * base`` clipped to [0, 1], with s chosen so that its weighted mean is ``target``."""
    if target <= 0:
        return np.zeros_like(base)
    lo, hi = 0.0, 1.0
    while np.average(np.minimum(hi * base, 1.0), weights=weights) < target:
        hi *= 2
    for _ in range(80):
        mid = (lo + hi) / 2
        if np.average(np.minimum(mid * base, 1.0), weights=weights) < target:
            lo = mid
        else:
            hi = mid
    return np.minimum(hi * base, 1.0)


def _shape(name: str, rng: np.random.Generator, size: int) -> np.ndarray:
    if name == "skewed":
        return rng.gamma(2.0, 1.0, size)
    if name == "heavy":
        return rng.lognormal(0.0, 1.0, size)
    raise ValueError(name)


# ---------------------------------------------------------------- real records


@dataclass
class Real:
    """Per-item values of a real smoke evaluation (``--records E``), per suite and artifact."""

    text: list[dict]  # wikitext windows of hopper-fp8
    text_source: list[dict]
    chain: list[dict]  # long-chain traces of hopper-fp8
    draft_chain: list[dict]  # long-chain traces of draft-int4
    chain_source: list[dict]

    @classmethod
    def load(cls, eval_dir: Path) -> Real:
        def samples(model: str, suite: str) -> list[dict]:
            return json.loads((eval_dir / model / f"{suite}.json").read_text())["samples"]

        return cls(
            samples("hopper-fp8", "wikitext"),
            samples("source", "wikitext"),
            samples("hopper-fp8", "long-chain"),
            samples("draft-int4", "long-chain"),
            samples("source", "long-chain"),
        )


# ---------------------------------------------------------------- populations: (artifact, source, approved) records


@dataclass
class Population:
    """Items to draw from (with replacement), each a (source, artifact, approved) record triple, and
    what the floor is: its suite, kind and value."""

    suite: str
    floor: dict
    source: list[dict]
    artifact: list[dict]
    old: list[dict] | None = None


def _text_records(kld, agree, nll_a, nll_s, tails, tokens) -> tuple[list[dict], list[dict]]:
    art, src = [], []
    for i in range(len(kld)):
        t = float(tokens[i])
        art.append(
            {
                "item": i,
                "tokens": t,
                "nll_sum": float(nll_a[i]),
                "kld_mean": float(kld[i]),
                "top1_agreement": float(agree[i]),
                "kld_top": tails[i],
            }
        )
        src.append(
            {
                "item": i,
                "tokens": t,
                "nll_sum": float(nll_s[i]),
                "kld_mean": 0.0,
                "top1_agreement": 1.0,
                "kld_top": [0.0],
            }
        )
    return art, src


def text_population(kind: str, shape: str, departure: float, rng, real: Real | None) -> Population:
    """wikitext floors: kld_mean max 0.05, top1_agreement min 0.85, perplexity max_delta_pct 5,
    kld_p99 max 0.5, and kld_mean max_regression 0.01 against an approved version."""
    if shape == "real":
        assert real is not None
        tokens = np.array([r["tokens"] for r in real.text], dtype=float)
        base_kld = np.array([r["kld_mean"] for r in real.text], dtype=float)
        base_dis = 1.0 - np.array([r["top1_agreement"] for r in real.text], dtype=float)
        nll_s = np.array([r["nll_sum"] for r in real.text_source], dtype=float)
        base_dnll = (np.array([r["nll_sum"] for r in real.text], dtype=float) - nll_s) / tokens
        real_tails = [np.asarray(r["kld_top"], dtype=float) for r in real.text]
    else:
        size = 2000 if kind == "kld_p99" else POP
        tokens = np.full(size, float(TOKENS))
        base_kld = base_dis = base_dnll = _shape(shape, rng, size)
        nll_s = tokens * 3.4
        real_tails = None
    n_items = len(tokens)
    zeros = np.zeros(n_items)
    tails: list[list[float]] = [[0.0]] * n_items
    kld, agree, nll_a = zeros, np.ones(n_items), nll_s
    floor: dict
    old = None
    if kind == "kld_mean":
        floor = {"metric": "kld_mean", "max": 0.05}
        kld = departure * _unit(base_kld, tokens)
    elif kind == "top1_agreement":
        floor = {"metric": "top1_agreement", "min": 0.85}
        agree = 1.0 - _clipped_mean(base_dis, departure, tokens)
    elif kind == "perplexity":
        floor = {"metric": "perplexity", "max_delta_pct": 5.0}
        mean_change = math.log1p(departure / 100.0)
        nll_a = (
            nll_s
            + mean_change
            * _unit(np.abs(base_dnll) if np.sum(base_dnll * tokens) <= 0 else base_dnll, tokens)
            * tokens
        )
    elif kind == "kld_p99":
        floor = {"metric": "kld_p99", "max": 0.5}
        if real_tails is not None:
            per_window = real_tails
        else:  # per-token values within a window share its scale (windows are clusters)
            scales = rng.lognormal(0.0, 0.5, n_items)
            per_window = [
                np.sort(_shape(shape, rng, TOKENS) * scales[i])[::-1][:KEEP] for i in range(n_items)
            ]
        try:
            from quantgate.metrics import pooled_quantile
        except ImportError:  # where older trees keep it
            from quantgate.evaluate.suites.metrics import pooled_quantile

        column = np.empty(n_items, dtype=object)
        column[:] = [np.asarray(w, dtype=float) for w in per_window]
        p99 = float(pooled_quantile(0.99, "top", "n")({"top": column, "n": tokens}, {}, -1))
        c = departure / p99 if p99 > 0 else 0.0
        tails = [list(np.round(c * np.asarray(w), 12)) for w in per_window]
        kld = np.array([float(np.mean(w)) for w in tails])
    elif kind == "kld_regression":
        floor = {"metric": "kld_mean", "max_regression": 0.01}
        was = 0.03 * _unit(base_kld, tokens)
        change = departure * _unit(_shape("skewed", rng, n_items) if shape == "real" else base_kld, tokens)
        kld = was + change
        old_art, _ = _text_records(was, agree, nll_a, nll_s, tails, tokens)
        old = old_art
    else:
        raise ValueError(kind)
    art, src = _text_records(kld, agree, nll_a, nll_s, tails, tokens)
    return Population("wikitext", floor, src, art, old)


def chain_population(kind: str, shape: str, departure: float, rng, real: Real | None) -> Population:
    """long-chain floors: agreement_at_depth min 0.97 (traces that do not reach the deepest bin weigh
    nothing) and acceptance_k4 min_recovery 0.6 (a draft's accepted tokens against the source's)."""
    if shape == "real":
        assert real is not None
        depth = np.array([r.get("depth_tokens", 0) for r in real.chain], dtype=float)
        base_dis = 1.0 - np.array([r.get("depth_agreement", 1.0) for r in real.chain], dtype=float)
        s_acc = np.array([r["accepted_per_step_k4"] for r in real.chain_source], dtype=float)
        a_acc = np.array([r["accepted_per_step_k4"] for r in real.draft_chain], dtype=float)
        base_loss = np.clip(1.0 - a_acc / np.maximum(s_acc, 1e-9), 0.0, 1.0) + 1e-3
    else:
        depth = np.where(rng.random(POP) < 0.3, 0.0, 48.0)  # 30 % of traces end before the deepest bin
        base_dis = base_loss = _shape(shape, rng, POP)
        s_acc = np.full(POP, 4.0)
    n_items = len(depth)
    agree = np.ones(n_items)
    acc = s_acc
    if kind == "agreement_at_depth":
        floor = {"metric": "agreement_at_depth", "min": 0.97}
        agree = 1.0 - _clipped_mean(base_dis, departure, np.maximum(depth, 1e-12) * (depth > 0))
    elif kind == "acceptance":
        floor = {"metric": "acceptance_k4", "min_recovery": 0.6}
        acc = s_acc * (1.0 - _clipped_mean(base_loss, departure, s_acc))
    else:
        raise ValueError(kind)

    def records(agreement, accepted) -> list[dict]:
        return [
            {
                "item": i,
                "trace_tokens": 192,
                "kld_mean": 0.0,
                "top1_agreement": float(agreement[i]),
                "first_divergence": 0,
                "accepted_per_step_k4": float(accepted[i]),
                "depth_tokens": int(depth[i]),
                "depth_agreement": float(agreement[i]) if depth[i] > 0 else 0.0,
            }
            for i in range(n_items)
        ]

    return Population("long-chain", floor, records(np.ones(n_items), s_acc), records(agree, acc))


def events_population(kind: str, shape: str, departure: float, rng, real: Real | None) -> Population:
    """gsm8k floors on 0/1 answers, the source solving half the items: flip_loss_rate max L and
    accuracy min_recovery 1 - L, with L the shape's rate; ``departure`` is the loss rate."""
    rate = float(shape.split("@")[1])
    solved = rng.random(POP) < 0.5
    # exact: rescale the finite population's losses to the true rate among the solved items
    order = np.flatnonzero(solved)
    lost = np.zeros(POP, dtype=bool)
    lost[order[: round(departure * len(order))]] = True
    correct = solved & ~lost
    floor = (
        {"metric": "flip_loss_rate", "max": rate}
        if kind == "loss_rate"
        else {"metric": "accuracy", "min_recovery": 1.0 - rate}
    )

    def records(c) -> list[dict]:
        return [
            {"item": i, "correct_flexible-extract": bool(c[i]), "correct_strict-match": bool(c[i])}
            for i in range(POP)
        ]

    return Population("gsm8k", floor, records(solved), records(correct))


KINDS: dict[str, tuple[Callable, float, tuple[str, ...]]] = {
    # name: (population builder, tolerance (departure at the floor), shapes)
    "kld_mean": (text_population, 0.05, ("real", "skewed", "heavy")),
    "top1_agreement": (text_population, 0.15, ("real", "skewed", "heavy")),
    "perplexity": (text_population, 5.0, ("real", "skewed", "heavy")),
    "kld_p99": (text_population, 0.5, ("real", "skewed", "heavy")),
    "kld_regression": (text_population, 0.01, ("real", "skewed", "heavy")),
    "agreement_at_depth": (chain_population, 0.03, ("real", "skewed", "heavy")),
    "acceptance": (chain_population, 0.4, ("real", "skewed", "heavy")),
    "loss_rate": (events_population, math.nan, ("0/1@0.02", "0/1@0.05", "0/1@0.25", "0/1@0.5")),
    "recovery": (events_population, math.nan, ("0/1@0.02", "0/1@0.05", "0/1@0.25", "0/1@0.5")),
}


def departure_for(kind: str, shape: str, truth: str) -> float:
    """The true departure from no change: 0, half, all or twice the floor's tolerance."""
    tol = KINDS[kind][1]
    if math.isnan(tol):
        tol = float(shape.split("@")[1])
    factor = {"none": 0.0, "half": 0.5, "floor": 1.0, "double": 2.0}[truth]
    departure = factor * tol
    return min(departure, 1.0) if kind in ("loss_rate", "recovery") else departure


# ---------------------------------------------------------------- deciding as the gate does


def _suites():
    from quantgate.config.gates import project_suites
    from quantgate.config.targets import Catalog

    return project_suites(Catalog(ROOT))


@dataclass
class Columns:
    """A population's records as the suite's own columns (``SuiteKind.columns`` of every record,
    computed once), so that a run resamples rows instead of rebuilding records."""

    source: dict[str, np.ndarray]
    artifact: dict[str, np.ndarray]
    old: dict[str, np.ndarray] | None

    @classmethod
    def of(cls, suite, pop: Population) -> Columns:
        from quantgate.stats.sequence import ordered_columns

        return cls(
            ordered_columns(suite, pop.source),
            ordered_columns(suite, pop.artifact),
            ordered_columns(suite, pop.old) if pop.old is not None else None,
        )

    @staticmethod
    def take(cols: dict[str, np.ndarray], idx: np.ndarray) -> dict[str, np.ndarray]:
        return {k: v[idx] for k, v in cols.items()}


def run_new(suite, floor, cols: Columns, idx: np.ndarray, design: str) -> str:
    """This tree's gate on one draw: the sequential design's early looks (``sequence.linearize`` and
    ``sequence.decide`` after every batch, as ``sequence.check`` runs them), then the fixed design's
    ``floor.plan`` -> ``floor.measure`` -> ``floor.decide`` (as ``evaluate_floor`` composes them,
    without the reported ends a decision does not need)."""
    from quantgate.gate import floor as step
    from quantgate.gate.verdict import Before
    from quantgate.stats import sequence

    measure = suite.metrics()[floor.metric]
    a, s = Columns.take(cols.artifact, idx), Columns.take(cols.source, idx)
    o = Columns.take(cols.old, idx) if cols.old is not None else None
    confidence = CONFIDENCE
    if design == "sequential":
        if floor.kind != "max_regression":
            alpha = sequence.early_alpha(CONFIDENCE)
            for used in range(BATCH, len(idx) + 1, BATCH):
                head = {k: v[:used] for k, v in a.items()}
                lin = sequence.linearize(
                    floor.kind, floor.value, measure, head, Columns.take(s, slice(0, used)), s
                )
                if isinstance(lin, str):
                    break
                got = sequence.decide(lin, alpha, ends=False)
                if got.decision != "undecided":
                    return got.decision
        confidence = sequence.final_confidence(CONFIDENCE)
    before = Before("v1", None, None, {}) if floor.kind == "max_regression" else None
    p = step.plan(floor, measure, s, confidence=confidence, before=before, old=o)
    if isinstance(p, str):
        return "insufficient_evidence"
    return step.decide(p, step.measure(p, a, s, o, ends=False), advisory=floor.advisory).status


def decide_before(suite, floor, src: dict, art: dict, old: dict | None, confidence: float) -> str:
    """The older tree's decision: its evaluate_floor (the regression compared with the approved
    version's metric, as it did)."""
    from quantgate.gate.verdict import Before, evaluate_floor

    before = None
    if floor.kind == "max_regression":
        measure = suite.metrics()[floor.metric]
        value = float(measure.statistic(*_columns(suite, old, src), -1))
        before = Before("v1", value)
    return evaluate_floor(floor, suite, src, art, confidence=confidence, before=before).status


def _columns(suite, result: dict, source: dict):
    def cols(res):
        rows = [suite.columns(r) for r in res["samples"]]
        return {
            k: np.asarray([r[k] for r in rows], dtype=object if isinstance(rows[0][k], list) else float)
            for k in rows[0]
        }

    return cols(result), cols(source)


def run_before(suite, floor, pop: Population, idx: np.ndarray, design: str) -> str:
    """An older tree's gate on one draw, from the records: its ``sequence.check`` after every batch,
    then its ``evaluate_floor``."""
    try:
        from quantgate.gate import sequence  # where older trees keep it
    except ImportError:
        from quantgate.stats import sequence

    n = len(idx)

    def pick(records):
        return [{**records[j], "item": i} for i, j in enumerate(idx)]

    src = {"samples": pick(pop.source)}
    art = {"samples": pick(pop.artifact)}
    old = {"samples": pick(pop.old)} if pop.old is not None else None
    if design == "sequential" and floor.kind != "max_regression":
        for used in range(BATCH, n + 1, BATCH):
            got = sequence.check(floor, suite, src, art["samples"][:used], CONFIDENCE)
            if not isinstance(got, str) and got.decision != "undecided":
                return got.decision
    confidence = sequence.final_confidence(CONFIDENCE) if design == "sequential" else CONFIDENCE
    return decide_before(suite, floor, src, art, old, confidence)


@dataclass(frozen=True)
class Cell:
    """One cell of the grid."""

    kind: str
    shape: str
    n: int
    truth: str
    design: str


def run_cell(args: tuple[Cell, str, int, str | None]) -> dict:
    """Every run of one cell: the rates of each status."""
    from quantgate.config.gates import Floor

    cell, gate, runs, records = args
    real = Real.load(Path(records)) if records else None
    seed = zlib.crc32(f"{cell.kind}|{cell.shape}|{cell.truth}".encode())
    rng = np.random.default_rng(seed)
    builder = KINDS[cell.kind][0]
    pop = builder(cell.kind, cell.shape, departure_for(cell.kind, cell.shape, cell.truth), rng, real)
    suite = _suites()[pop.suite]
    floor = Floor(suite=pop.suite, **pop.floor)
    run_rng = np.random.default_rng([seed, cell.n, 1 if cell.design == "sequential" else 0])
    cols = Columns.of(suite, pop) if gate == "new" else None
    started = time.perf_counter()
    counts: dict[str, int] = {}
    for _ in range(runs):
        idx = run_rng.integers(0, len(pop.artifact), cell.n)
        if cols is not None:
            status = run_new(suite, floor, cols, idx, cell.design)
        else:
            status = run_before(suite, floor, pop, idx, cell.design)
        counts[status] = counts.get(status, 0) + 1
    passed = counts.get("pass", 0) / runs
    return {
        **cell.__dict__,
        "gate": gate,
        "runs": runs,
        "pass": passed,
        "fail": counts.get("fail", 0) / runs,
        "mc_error": math.sqrt(max(passed * (1 - passed), 1e-12) / runs),
        "statuses": counts,
        "seconds": round(time.perf_counter() - started, 1),
    }


def cells(kinds, shapes, ns, truths, designs, have_real: bool) -> list[Cell]:
    """The grid: every kind x its shapes x n x truth x design (real shapes only with --records)."""
    return [
        Cell(k, sh, n, t, d)
        for k in kinds
        for sh in KINDS[k][2]
        if (sh != "real" or have_real) and (shapes is None or sh in shapes)
        for n in ns
        for t in truths
        for d in designs
    ]


def table(rows: list[dict], before: list[dict] | None = None) -> str:
    """The grid as Markdown: per (kind, shape, design) and n, the false-pass rate at the floor, then
    P(pass) at half the tolerance and P(fail) at twice it (either, when only one was run); with
    ``before``, its false-pass rate too."""
    cell = {(r["kind"], r["shape"], r["design"], r["n"], r["truth"]): r for r in rows}
    old = {(r["kind"], r["shape"], r["design"], r["n"], r["truth"]): r for r in before or []}
    ns = sorted({r["n"] for r in rows})
    head = "| floor kind | shape | design | " + " | ".join(f"n = {n}" for n in ns) + " |"
    lines = [head, "|" + " --- |" * (3 + len(ns))]
    keys = sorted(
        {(r["kind"], r["shape"], r["design"]) for r in rows}, key=lambda k: (list(KINDS).index(k[0]), k[1:])
    )
    for kind, shape, design in keys:
        parts = []
        for n in ns:
            at = cell.get((kind, shape, design, n, "floor"))
            half = cell.get((kind, shape, design, n, "half"))
            double = cell.get((kind, shape, design, n, "double"))
            was = old.get((kind, shape, design, n, "floor"))
            text = f"{100 * at['pass']:.1f}" if at else "—"
            if was:
                text = f"{100 * was['pass']:.1f} → {text}"
            if half and double:
                text += f" ({100 * half['pass']:.0f} / {100 * double['fail']:.0f})"
            elif half:
                text += f" ({100 * half['pass']:.0f})"
            parts.append(text)
        lines.append(f"| {kind} | {shape} | {design} | " + " | ".join(parts) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gate", choices=("new", "before"), default="new")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument(
        "--records", type=Path, default=None, help="an evaluation directory of the default model"
    )
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--shapes", default=None)
    parser.add_argument("--n", default=",".join(map(str, GRID_N)))
    parser.add_argument("--truths", default=",".join(TRUTHS))
    parser.add_argument("--designs", default="fixed,sequential")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--table",
        type=Path,
        nargs="+",
        default=None,
        help="print the Markdown table of a result JSON (then an older one)",
    )
    args = parser.parse_args()
    if args.table:
        results = [json.loads(p.read_text())["cells"] for p in args.table]
        print(table(results[0], results[1] if len(results) > 1 else None))
        return
    grid = cells(
        args.kinds.split(","),
        args.shapes.split(",") if args.shapes else None,
        [int(x) for x in args.n.split(",")],
        args.truths.split(","),
        args.designs.split(","),
        args.records is not None,
    )
    todo = [(c, args.gate, args.runs, str(args.records) if args.records else None) for c in grid]
    rows = []
    with ProcessPoolExecutor(args.workers) as pool:
        for row in pool.map(run_cell, todo):
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = {
        "gate": args.gate,
        "confidence": CONFIDENCE,
        "runs": args.runs,
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "cells": rows,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
