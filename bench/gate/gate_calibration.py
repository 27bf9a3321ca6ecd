"""Gate calibration on families of damage shapes (issue 43): how often each floor kind passes an
artifact whose true value sits exactly at its floor (a false pass; 1 - c = 5 % promised), how often it
passes at half the tolerance (power), and how often it fails an identical or near-identical copy (a
false alarm), by simulation through the gate's own code, under both evaluation designs.

Usage:
  .venv/bin/python bench/gate/gate_calibration.py [--runs 1000] [--records E] [--workers 2] [--out F]
      [--kinds a,b] [--families a,b] [--n 16,64,256] [--truths floor,half,copy] [--designs fixed,sequential]
  PYTHONPATH=<old tree>/src .venv/bin/python bench/gate/gate_calibration.py --gate before ...
  .venv/bin/python bench/gate/gate_calibration.py --table NEW.json [BEFORE.json]

Every cell draws ``--runs`` evaluations of n items from a finite population (20,000 items) whose
true value is known exactly, and decides the floor as the gate does:

- ``--gate new`` (this tree): the fixed design is ``floor.plan`` -> ``floor.measure`` ->
  ``floor.decide`` (what ``evaluate_floor`` composes, without the ends a decision does not need);
  the sequential design runs ``sequence.decide`` (what ``sequence.check`` runs) after every batch of
  8 items and stops at the first decision, else decides on every item at ``final_confidence``.
- ``--gate before`` (an older tree on PYTHONPATH): its ``sequence.check`` and ``evaluate_floor`` on
  the same draws, written as the per-item records a suite writes.

Families (per-item departure from no change, in the floor's own terms, rescaled to the true value):
``gamma2`` (skewed); ``lognormal<s>``; ``pareto<a>``; ``rare<f>/<c>``: f % of items carry c % of the
mean; ``ar<rho>-old``: an AR(1) series along the corpus, n consecutive windows from a random start
(the design before this change) and ``ar<rho>-new``: n windows drawn at random; ``uneven``: window
weights from 8 to 63 tokens; ``depthcorr``: traces whose weight in the deepest bin grows with their
disagreement; ``real``: the default model's own windows and traces (``--records``, an evaluation
directory); ``copy`` (no departure at all) and ``near`` (departures within the measured numerics
spread); for answers, ``0/1@<rate>`` and ``noisy@<rate>`` (the source's own re-evaluation flips 5 of
24 answers, as on a GPU). Each family is also run clipped to the stated class (``<family>@class``:
no item worse than the class allows, the mean kept) when its raw form is not: the raw cell is
outside the class (reported as such, with the share of items beyond it), the clipped one inside.

Printed and written (``--out``) as JSON, one row per cell, each with its Monte-Carlo error.
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

ROOT = Path(__file__).resolve().parents[2]
CONFIDENCE = 0.95
BATCH = 8
POP = 20_000
TOKENS = 63  # scored tokens per text window (64-token windows)
WORSE = 10.0  # the stated class: no item worse than 10 tolerances (gates.yaml item_range.worse)
TRUTHS = ("floor", "half", "copy")
GRID_N = (16, 64, 256)


# ---------------------------------------------------------------- families: positive base shapes


def _ar(rho: float, rng, size: int) -> np.ndarray:
    """A stationary AR(1) series (unit innovations scaled to a unit marginal), exponentiated: positive,
    skewed, neighbours correlated (about rho between adjacent windows on the log scale)."""
    x = np.empty(size)
    x[0] = rng.normal()
    e = rng.normal(size=size) * math.sqrt(1 - rho**2)
    for t in range(1, size):
        x[t] = rho * x[t - 1] + e[t]
    return np.exp(0.75 * x)


def base_values(family: str, rng, size: int) -> np.ndarray:
    """Positive per-item values of a family, any scale (the population rescales them)."""
    name = family.split("@")[0]
    if name == "gamma2" or name in ("uneven", "depthcorr"):
        return rng.gamma(2.0, 1.0, size)
    if name.startswith("lognormal"):
        return rng.lognormal(0.0, float(name.removeprefix("lognormal")), size)
    if name.startswith("pareto"):
        return rng.pareto(float(name.removeprefix("pareto")), size) + 1.0
    if name.startswith("rare"):
        f, c = (float(x) / 100 for x in name.removeprefix("rare").split("/"))
        rare = rng.random(size) < f
        k = max(int(rare.sum()), 1)
        out = np.full(size, (1 - c) / max(size - k, 1))
        out[rare] = c / k
        return out
    if name.startswith("ar"):
        return _ar(float(name.removeprefix("ar").split("-")[0]), rng, size)
    if name == "near":
        return rng.random(size)
    raise ValueError(family)


def whole_tokens(share: np.ndarray, tokens: np.ndarray, target: float, rng) -> np.ndarray:
    """Tokens above a p99 floor per window, whole numbers, from fractional ``share``s (stochastic
    rounding), then nudged one token at a time until exactly ``target`` of all tokens are above."""
    above = np.floor(share) + (rng.random(len(share)) < share - np.floor(share))
    above = np.minimum(above, tokens).astype(int)
    want = round(target * float(np.sum(tokens)))
    while (gap := want - int(above.sum())) != 0:
        room = np.flatnonzero(above < tokens) if gap > 0 else np.flatnonzero(above > 0)
        pick = rng.choice(room, min(abs(gap), len(room)), replace=False, p=None)
        above[pick] += 1 if gap > 0 else -1
    return above


def clipped(base: np.ndarray, target: float, cap: float, weights: np.ndarray | None = None) -> np.ndarray:
    """``s * base`` clipped at ``cap``, with s solved so that the (``weights``-weighted) mean is ``target``."""
    w = np.ones_like(base) if weights is None else weights

    def mean(x: np.ndarray) -> float:
        return float(np.sum(x * w) / np.sum(w))

    if not math.isfinite(cap):
        return base * (target / mean(base))
    lo, hi = 0.0, target / mean(base)
    while mean(np.minimum(hi * base, cap)) < target:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean(np.minimum(mid * base, cap)) < target else (lo, mid)
    return np.minimum(hi * base, cap)


def departures(
    family: str, target: float, cap: float, natural: float, rng, size: int
) -> tuple[np.ndarray, float]:
    """Per-item departures with mean exactly ``target``: the family rescaled within the quantity's own
    range (``natural``), or (``@class``) clipped at the class's ``cap`` with the mean kept; and the
    share of items beyond ``cap``."""
    if target <= 0:
        return np.zeros(size), 0.0
    d = clipped(base_values(family, rng, size), target, cap if family.endswith("@class") else natural)
    return d, float(np.mean(d > cap * (1 + 1e-9)))


# ---------------------------------------------------------------- populations: records of a suite


@dataclass
class Population:
    """Items to draw (source, artifact and, for a regression, approved-version records), the floor,
    the population's share of items beyond the class, and how windows are drawn."""

    suite: str
    floor: dict
    source: list[dict]
    artifact: list[dict]
    old: list[dict] | None = None
    beyond: float = 0.0
    consecutive: bool = False  # the design before: n neighbouring windows from a random start


@dataclass
class Real:
    """Per-item values of a real smoke evaluation (``--records E``): text windows and traces."""

    text: list[dict]
    text_source: list[dict]
    chain: list[dict]
    draft_chain: list[dict]
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


def _text(kld, agree, nll_a, nll_s, tails, tokens) -> tuple[list[dict], list[dict]]:
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


TEXT_FLOORS = {
    "kld_mean": ({"metric": "kld_mean", "max": 0.05}, 0.05),
    "top1_agreement": ({"metric": "top1_agreement", "min": 0.85}, 0.15),
    "perplexity": ({"metric": "perplexity", "max_delta_pct": 5.0}, math.log1p(0.05)),
    "kld_p99": ({"metric": "kld_p99", "max": 0.5}, 0.01),
    "kld_regression": ({"metric": "kld_mean", "max_regression": 0.01}, 0.01),
}


def text_population(kind: str, family: str, factor: float, rng, real: Real | None) -> Population:
    """wikitext floors: the departure is a window's KL, disagreement, NLL change, fraction of tokens
    above the p99 floor, or KL over the approved version's, per family."""
    floor, tol = TEXT_FLOORS[kind]
    cap = WORSE * tol
    if family.startswith("real"):
        assert real is not None
        field = {
            "kld_mean": "kld_mean",
            "kld_regression": "kld_mean",
            "top1_agreement": "top1_agreement",
        }.get(kind)
        if kind == "perplexity":
            base = np.array(
                [
                    (a["nll_sum"] - s["nll_sum"]) / a["tokens"]
                    for a, s in zip(real.text, real.text_source, strict=True)
                ]
            )
        elif kind == "kld_p99":
            base = np.array([np.sum(np.asarray(r["kld_top"]) > 0.2) / r["tokens"] for r in real.text])
        else:
            base = np.array([r[field] for r in real.text])
            base = 1.0 - base if kind == "top1_agreement" else base
        base = np.maximum(base, 0.0) + 1e-6
        pick = rng.integers(0, len(base), POP)
        natural = 1.0 if kind in ("top1_agreement", "kld_p99") else math.inf
        limit = min(cap, natural) if family.endswith("@class") else natural
        d = clipped(base[pick], factor * tol, limit) if factor > 0 else np.zeros(POP)
        beyond = float(np.mean(d > min(cap, natural) * (1 + 1e-9)))
    elif family == "copy":
        d, beyond = np.zeros(POP), 0.0
    elif family == "near":  # within the measured numerics spread of a copy (1e-4 of the tolerance and below)
        d, beyond = rng.random(POP) * 1e-4 * tol, 0.0
    else:
        natural = 1.0 if kind in ("top1_agreement", "kld_p99") else math.inf  # a fraction: at most 1
        d, beyond = departures(family, factor * tol, min(cap, natural), natural, rng, POP)
    tokens = (
        rng.integers(8, TOKENS + 1, POP).astype(float)
        if family.startswith("uneven")
        else np.full(POP, float(TOKENS))
    )
    nll_s = tokens * 3.4
    kld, agree, nll_a = np.zeros(POP), np.ones(POP), nll_s.copy()
    tails: list[list[float]] = [[0.0]] * POP
    old = None
    if kind == "kld_mean":
        kld = d
    elif kind == "top1_agreement":
        agree = 1.0 - d
    elif kind == "perplexity":
        nll_a = nll_s + d * tokens
    elif kind == "kld_p99":  # a window's tokens above the floor (0.5) at 0.8, the rest at 0.05
        above = whole_tokens(d * tokens, tokens, factor * tol, rng)
        tails = [
            [0.8] * int(k) + [0.05] * min(int(t) - int(k), 2) for k, t in zip(above, tokens, strict=True)
        ]
        kld = (0.8 * above + 0.05 * (tokens - above)) / tokens
    elif kind == "kld_regression":
        was = 0.03 * (base_values("gamma2", rng, POP) / 2.0)
        kld = was + d
        old, _ = _text(was, agree, nll_a, nll_s, tails, tokens)
    art, src = _text(kld, agree, nll_a, nll_s, tails, tokens)
    return Population("wikitext", floor, src, art, old, beyond, consecutive=family.endswith("-old"))


def chain_population(kind: str, family: str, factor: float, rng, real: Real | None) -> Population:
    """long-chain floors: agreement_at_depth min 0.97 (traces that end before the deepest bin weigh
    nothing) and acceptance_k4 min_recovery 0.6 (a draft's accepted tokens against the source's)."""
    tol = 0.03 if kind == "agreement_at_depth" else 0.4
    cap = WORSE * tol
    depth = np.where(rng.random(POP) < 0.3, 0.0, 48.0)
    s_acc = np.full(POP, 4.9)
    if family.startswith("real"):
        assert real is not None
        if kind == "agreement_at_depth":
            base = np.array([1.0 - r.get("depth_agreement", 1.0) for r in real.chain]) + 1e-4
            w = np.array([r.get("depth_tokens", 0) for r in real.chain], dtype=float)
        else:
            acc = np.array([r["accepted_per_step_k4"] for r in real.draft_chain])
            srcacc = np.array([r["accepted_per_step_k4"] for r in real.chain_source])
            base = np.clip(1 - acc / np.maximum(srcacc, 1e-9), 0, 1) + 1e-4
            w = np.full(len(base), 48.0)
        pick = rng.integers(0, len(base), POP)
        depth = w[pick]
        d = (
            clipped(base[pick], factor * tol, min(cap, 1.0) if family.endswith("@class") else 1.0)
            if factor > 0
            else np.zeros(POP)
        )
        beyond = float(np.mean(d > min(cap, 1.0) * (1 + 1e-9)))
    elif family in ("copy", "near"):
        d = np.zeros(POP) if family == "copy" else rng.random(POP) * 1e-4 * tol
        beyond = 0.0
    else:
        d, beyond = departures(family, factor * tol, min(cap, 1.0), 1.0, rng, POP)
        if family.startswith("depthcorr"):  # the deepest bin holds more tokens where agreement is worse
            depth = np.where(
                rng.random(POP) < 0.3, 0.0, np.clip(8 + 40 * d / max(d.max(), 1e-12), 8, 48).round()
            )
    if (
        kind == "agreement_at_depth" and factor > 0
    ):  # the token-weighted mean at the truth, within the cap used
        weights = np.maximum(depth, 1e-12) * (depth > 0)
        d = clipped(
            np.maximum(d, 1e-12), factor * tol, min(cap, 1.0) if family.endswith("@class") else 1.0, weights
        )
        beyond = float(np.sum(weights * (d > min(cap, 1.0) * (1 + 1e-9))) / np.sum(weights))
    if kind == "agreement_at_depth":
        floor = {"metric": "agreement_at_depth", "min": 0.97}
        agree, acc = 1.0 - d, s_acc
    else:
        floor = {"metric": "acceptance_k4", "min_recovery": 0.6}
        agree, acc = np.ones(POP), s_acc * (1.0 - d)

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
            for i in range(POP)
        ]

    return Population("long-chain", floor, records(np.ones(POP), s_acc), records(agree, acc), None, beyond)


def events_population(kind: str, family: str, factor: float, rng, real: Real | None) -> Population:
    """gsm8k-shaped floors on 0/1 answers, the source solving half the items: flip_loss_rate max L and
    accuracy min_recovery 1 - L (L the family's rate). ``noisy``: the evaluation itself flips a solved
    answer 5 times in 24 (the GPU-against-CPU flips measured on support-domain), so an identical copy
    loses answers too, and the source's records carry its own re-evaluation on that device, which
    the gate pairs the artifact's losses with."""
    from quantgate.declarations.metrics import RERUN

    rate = float(family.split("@")[1])
    solved = rng.random(POP) < 0.5
    ids = np.flatnonzero(solved)
    lost = np.zeros(POP, dtype=bool)
    lost[ids[: round(min(factor * rate, 1.0) * len(ids))]] = True
    rerun = None
    if family.startswith("noisy"):  # the artifact and the source's re-evaluation flip independently
        lost |= solved & (rng.random(POP) < 5 / 24)
        rerun = solved & ~(rng.random(POP) < 5 / 24)
    correct = solved & ~lost
    floor = (
        {"metric": "flip_loss_rate", "max": rate}
        if kind == "loss_rate"
        else {"metric": "accuracy", "min_recovery": 1.0 - rate}
    )

    def record(c, i) -> dict:
        return {"item": i, "correct_flexible-extract": bool(c[i]), "correct_strict-match": bool(c[i])}

    source = [record(solved, i) for i in range(POP)]
    if rerun is not None:  # the source's records carry its re-evaluation, as the evaluation writes them
        for i, r in enumerate(source):
            r[RERUN] = record(rerun, i)
    return Population("gsm8k", floor, source, [record(correct, i) for i in range(POP)])


_TAILS = ("lognormal0.5", "lognormal1", "lognormal1.5", "lognormal2", "pareto1.5", "pareto2", "pareto3")
_RARE = ("rare1/50", "rare1/90", "rare5/50", "rare5/90", "rare20/50", "rare20/90")
_AR = ("ar0.3-old", "ar0.3-new", "ar0.6-old", "ar0.6-new", "ar0.9-old", "ar0.9-new")
TEXT_FAMILIES = ("real", "gamma2", *_TAILS, *_RARE, *_AR, "uneven", "copy", "near")
KINDS: dict[str, tuple[Callable, tuple[str, ...]]] = {
    "kld_mean": (text_population, TEXT_FAMILIES),
    "top1_agreement": (text_population, TEXT_FAMILIES),
    "perplexity": (text_population, TEXT_FAMILIES),
    "kld_p99": (text_population, ("real", "gamma2", "lognormal1", "pareto2", *_RARE, "uneven", "copy")),
    "kld_regression": (
        text_population,
        ("gamma2", "lognormal1", "pareto2", "rare5/90", "rare20/50", "copy", "near"),
    ),
    "agreement_at_depth": (
        chain_population,
        ("real", "gamma2", "lognormal1", "pareto2", "rare5/90", "depthcorr", "copy"),
    ),
    "acceptance": (chain_population, ("real", "gamma2", "lognormal1", "rare5/90", "copy")),
    "loss_rate": (events_population, ("0/1@0.05", "0/1@0.25", "noisy@0.25")),
    "recovery": (events_population, ("0/1@0.05", "0/1@0.25")),
}
FACTOR = {"floor": 1.0, "half": 0.5, "copy": 0.0}


# ---------------------------------------------------------------- deciding as the gate does


def _suites():
    from quantgate.config.gates import project_suites
    from quantgate.config.targets import Catalog

    return project_suites(Catalog(ROOT))


@dataclass
class Columns:
    """A population's records as the suite's own columns, computed once, so a run takes rows."""

    source: dict[str, np.ndarray]
    artifact: dict[str, np.ndarray]
    old: dict[str, np.ndarray] | None

    @classmethod
    def of(cls, suite, pop: Population) -> Columns:
        from quantgate.declarations.metrics import record_columns
        from quantgate.stats.sequence import ordered_columns

        return cls(
            ordered_columns(suite, pop.source, record_columns),
            ordered_columns(suite, pop.artifact),
            ordered_columns(suite, pop.old) if pop.old is not None else None,
        )

    @staticmethod
    def take(cols: dict[str, np.ndarray], idx) -> dict[str, np.ndarray]:
        return {k: v[idx] for k, v in cols.items()}


def run_new(suite, floor, cols: Columns, idx: np.ndarray, design: str) -> str:
    """This tree's gate on one draw: the sequential design's early looks, then the fixed design."""
    from quantgate.contracts.results import SampleDesign
    from quantgate.gate import floor as step
    from quantgate.gate.verdict import Before
    from quantgate.stats import ItemRange, forms, sequence

    measure = suite.metrics()[floor.metric]
    a, s = Columns.take(cols.artifact, idx), Columns.take(cols.source, idx)
    o = Columns.take(cols.old, idx) if cols.old is not None else None
    cls = ItemRange(worse=WORSE)
    weights = {"tokens": float(TOKENS), "trace_tokens": 192.0, "depth_tokens": 48.0}
    sampling = SampleDesign(unit="items", population=POP, weights=weights)
    confidence = CONFIDENCE
    if design == "sequential":
        if floor.kind != "max_regression":
            form = forms.floor_form(
                floor.kind, floor.value, measure, s, cls, name=floor.metric, weights=weights, population=POP
            )
            if not isinstance(form, str):
                decided = looked(form.linear(a, s), sequence.early_alpha(CONFIDENCE), BATCH)
                if decided is not None:
                    return decided
        confidence = sequence.final_confidence(CONFIDENCE)
    before = Before("v1", None, None, {}) if floor.kind == "max_regression" else None
    p = step.plan(
        floor,
        measure,
        s,
        confidence=confidence,
        before=before,
        old=o,
        item_range=cls,
        sampling=sampling,
        describe=False,
    )
    if isinstance(p, str):
        return "insufficient_evidence"
    return step.decide(p, step.measure(p, a, s, o, ends=False), advisory=floor.advisory).status


def looked(lin, alpha: float, batch: int) -> str | None:
    """What ``sequence.decide`` finds when looked at after every ``batch`` items, from one pass over
    the whole draw: the test's running maximum makes the look after a batch see every rejection
    within it, so each decision lands on the first look at or after the item that made it (the same
    as calling it per look: tests/unit/gate/test_gate_calibration.py)."""
    n = len(lin.u)
    inf = n + batch + 1
    beyond = int(lin.beyond[0]) + 1 if lin.beyond.size else inf
    passed = lin.passes_test(alpha) or inf
    failed = min(lin.fails_test(alpha) or inf, beyond)
    for look in range(batch, n + 1, batch):
        can_pass = passed <= look and beyond > look
        if can_pass and (failed > look or passed <= failed):
            return "pass"
        if failed <= look:
            return "fail"
    return None


def run_before(suite, floor, pop: Population, idx: np.ndarray, design: str) -> str:
    """An older tree's gate on one draw, from the records: its ``sequence.check`` after every batch,
    then its ``evaluate_floor`` (a regression compared with the approved version's metric)."""
    from quantgate.gate.verdict import Before, evaluate_floor

    try:
        from quantgate.gate import sequence  # where older trees keep it
    except ImportError:
        from quantgate.stats import sequence

    def pick(records):
        return [{**records[j], "item": i} for i, j in enumerate(idx)]

    head = {"suite": pop.suite, "kind": suite.spec.kind}
    src = {**head, "samples": pick(pop.source)}
    art = {**head, "samples": pick(pop.artifact)}
    if design == "sequential" and floor.kind != "max_regression":
        for used in range(BATCH, len(idx) + 1, BATCH):
            got = sequence.check(floor, suite, src["samples"], art["samples"][:used], CONFIDENCE)
            if not isinstance(got, str) and got.decision != "undecided":
                return got.decision
    confidence = sequence.final_confidence(CONFIDENCE) if design == "sequential" else CONFIDENCE
    before = None
    if floor.kind == "max_regression":
        old = {**head, "samples": pick(pop.old)}
        before = Before("v1", None, None, old)
    return evaluate_floor(floor, suite, src, art, confidence=confidence, before=before).status


@dataclass(frozen=True)
class Cell:
    """One cell of the grid."""

    kind: str
    family: str
    n: int
    truth: str
    design: str


def _draw(rng, pop: Population, n: int) -> np.ndarray:
    """n items: neighbours from a random start (the design before), else at random without replacement."""
    size = len(pop.artifact)
    if pop.consecutive:
        start = int(rng.integers(0, size - n))
        return np.arange(start, start + n)
    return rng.choice(size, n, replace=False)


def run_cell(args: tuple[Cell, str, int, str | None]) -> dict:
    """Every run of one cell: the rate of each status."""
    from quantgate.config.gates import Floor

    cell, gate, runs, records = args
    real = Real.load(Path(records)) if records else None
    seed = zlib.crc32(f"{cell.kind}|{cell.family}|{cell.truth}".encode())
    rng = np.random.default_rng(seed)
    builder = KINDS[cell.kind][0]
    pop = builder(cell.kind, cell.family, FACTOR[cell.truth], rng, real)
    suite = _suites()[pop.suite]
    floor = Floor(suite=pop.suite, **pop.floor)
    run_rng = np.random.default_rng([seed, cell.n, 1 if cell.design == "sequential" else 0])
    cols = Columns.of(suite, pop) if gate == "new" else None
    started = time.perf_counter()
    counts: dict[str, int] = {}
    for _ in range(runs):
        idx = _draw(run_rng, pop, cell.n)
        status = (
            run_new(suite, floor, cols, idx, cell.design)
            if cols is not None
            else run_before(suite, floor, pop, idx, cell.design)
        )
        counts[status] = counts.get(status, 0) + 1
    passed = counts.get("pass", 0) / runs
    return {
        **cell.__dict__,
        "gate": gate,
        "runs": runs,
        "pass": passed,
        "fail": counts.get("fail", 0) / runs,
        "mc_error": math.sqrt(max(passed * (1 - passed), 1e-12) / runs),
        "in_class": in_class(cell.family, pop.beyond),
        "beyond": pop.beyond,
        "statuses": counts,
        "seconds": round(time.perf_counter() - started, 1),
    }


def in_class(family: str, beyond: float) -> bool:
    """Whether a cell's population is in the stated class: no item beyond the class's cap, and items
    drawn at random (``-old``: neighbouring windows, the design before this change, is not)."""
    return beyond == 0.0 and "-old" not in family


def _variants(kind: str, family: str) -> list[str]:
    """A family, and its form clipped to the class when the raw one has items beyond it."""
    if family in ("copy", "near") or kind in ("loss_rate", "recovery", "top1_agreement"):
        return [family]
    return [family, f"{family}@class"]


def cells(kinds, families, ns, truths, designs, have_real: bool) -> list[Cell]:
    """The grid: every kind x its families (and their in-class forms) x n x truth x design; copies only
    at truths copy and near, other families only at floor and half."""
    out = []
    for k in kinds:
        for fam in families if families is not None else KINDS[k][1]:
            if fam.startswith("real") and not have_real:
                continue
            for variant in _variants(k, fam):
                for t in truths:
                    copies = fam in ("copy", "near") or fam.startswith("noisy")
                    if copies != (t == "copy") and not (fam.startswith("noisy") and t != "half"):
                        continue
                    out += [Cell(k, variant, n, t, d) for n in ns for d in designs]
    return out


def table(rows: list[dict], before: list[dict] | None = None) -> str:
    """Markdown: per (kind, family, design) and n, the false-pass % at the floor (before -> now), then
    in parentheses P(pass) % at half the tolerance; copies show P(fail) %; cells outside the class
    are marked with the share of items beyond it."""
    cell = {(r["kind"], r["family"], r["design"], r["n"], r["truth"]): r for r in rows}
    old = {(r["kind"], r["family"], r["design"], r["n"], r["truth"]): r for r in before or []}
    ns = sorted({r["n"] for r in rows})
    lines = [
        "| floor kind | family | class | design | " + " | ".join(f"n = {n}" for n in ns) + " |",
        "|" + " --- |" * (4 + len(ns)),
    ]
    keys = sorted(
        {(r["kind"], r["family"], r["design"]) for r in rows}, key=lambda k: (list(KINDS).index(k[0]), k[1:])
    )
    for kind, fam, design in keys:
        parts, klass = [], ""
        for n in ns:
            at, half = cell.get((kind, fam, design, n, "floor")), cell.get((kind, fam, design, n, "half"))
            copy = cell.get((kind, fam, design, n, "copy"))
            was = old.get((kind, fam, design, n, "floor")) or old.get((kind, fam, design, n, "copy"))
            anchor = at or copy
            if anchor is None:
                parts.append("—")
                continue
            if in_class(fam, anchor["beyond"]):
                klass = "in"
            elif "-old" in fam:
                klass = "out (neighbours, not drawn at random)"
            else:
                klass = f"out ({100 * anchor['beyond']:.2g} % beyond)"
            if at:
                text = f"{100 * at['pass']:.1f}"
                if was:
                    text = f"{100 * was['pass']:.1f} → {text}"
                if half:
                    text += f" ({100 * half['pass']:.0f})"
            else:
                text = f"fail {100 * copy['fail']:.1f}, pass {100 * copy['pass']:.0f}"
                if was:
                    text = f"fail {100 * was['fail']:.1f} → {text}"
            parts.append(text)
        lines.append(f"| {kind} | {fam} | {klass} | {design} | " + " | ".join(parts) + " |")
    return "\n".join(lines)


def summary(rows: list[dict], before: list[dict] | None = None) -> str:
    """Markdown, one row per floor kind and class: the worst false-pass % at the floor over every
    family, n and design (with its Monte-Carlo error and where), the cells above 5 % by more than two
    errors, and the worst false-fail % of an identical copy; ``before``: the same for an older gate
    on the cells it ran. ``noisy`` at the floor is left out: on a device that flips answers its
    excess loss over the source's own re-evaluation is below the floor (power, not a false pass)."""

    def worst(cells: list[dict], key: str) -> str:
        if not cells:
            return "—"
        r = max(cells, key=lambda c: c[key])
        return f"{100 * r[key]:.1f} ± {100 * r['mc_error']:.1f} ({r['family']}, n = {r['n']}, {r['design']})"

    def over(cells: list[dict]) -> int:
        return sum(c["pass"] > 1 - CONFIDENCE + 2 * c["mc_error"] for c in cells)

    lines = [
        "| floor kind | class | cells | worst false pass % | cells over 5 % | worst false fail of a copy % |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for gate, data in (("now", rows), ("before", before or [])):
        for kind in [k for k in KINDS if any(r["kind"] == k for r in data)]:
            mine = [r for r in data if r["kind"] == kind]
            at = [r for r in mine if r["truth"] == "floor" and not r["family"].startswith("noisy")]
            copies = [r for r in mine if r["truth"] == "copy"]
            for klass in ("in", "out"):
                cells = [r for r in at if in_class(r["family"], r["beyond"]) == (klass == "in")]
                if not cells:
                    continue
                tag = f"{kind} ({gate})" if before else kind
                copy = worst(copies, "fail") if klass == "in" else ""
                lines.append(
                    f"| {tag} | {klass} | {len(cells)} | {worst(cells, 'pass')} | {over(cells)} | {copy} |"
                )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gate", choices=("new", "before"), default="new")
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument(
        "--records", type=Path, default=None, help="an evaluation directory of the default model"
    )
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--families", default=None)
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
        help="print the table of a result JSON (then an older one)",
    )
    parser.add_argument(
        "--summary", action="store_true", help="with --table: one row per floor kind and class"
    )
    args = parser.parse_args()
    if args.table:
        results = [json.loads(p.read_text())["cells"] for p in args.table]
        show = summary if args.summary else table
        print(show(results[0], results[1] if len(results) > 1 else None))
        return
    grid = cells(
        args.kinds.split(","),
        args.families.split(",") if args.families else None,
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
        "class_worse": WORSE,
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "cells": rows,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
