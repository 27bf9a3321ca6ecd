"""Which text windows buy the most evidence per second (issue 43): the gate's own bound on every text
floor, from real evaluations of the default model's artifacts at several window designs, against the
seconds each design took; and how correlated neighbouring windows are (the design effect).

Usage:
  .venv/bin/python bench/eval/window_design.py E_w64c0 E_w128c64 E_w512c0 ... [--consecutive E_old] [--out F]

Each ``E_*`` is a ``quantgate eval --fixed --suites wikitext,traffic`` of the same artifacts with one
text profile (``tokens``, ``seq_len``, ``context``: read back from the records and run.json). For
every artifact, suite and floor of the shipped gates.yaml, the gate decides the floor on the
design's windows (``floor.plan`` -> ``measure``: the betting test within the stated class) and
reports the conservative end and the margin as a share of the tolerance; a design's *evidence per
second* is that margin per second of scoring. Sub-samples of the windows (the first n in draw
order) show how the margin grows with n at each window length.

``--consecutive E_old``: an evaluation by the tree before this change (windows cut one after another
from the start of the corpus); the lag-1 to lag-3 correlation of per-window values there, and the
design effect (the variance of a mean of n neighbouring windows against n independent ones,
estimated from blocks), beside the same for the random draw.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
FLOORS = [  # (tenant, suite, metric, kind, value): the shipped text floors
    ("chat", "wikitext", "perplexity", "max_delta_pct", 5.0),
    ("chat", "wikitext", "kld_mean", "max", 0.05),
    ("chat", "wikitext", "kld_p99", "max", 0.5),
    ("chat", "wikitext", "top1_agreement", "min", 0.85),
    ("chat", "traffic", "kld_mean", "max", 0.05),
    ("chat", "traffic", "top1_agreement", "min", 0.85),
    ("batch", "wikitext", "perplexity", "max_delta_pct", 10.0),
    ("batch", "wikitext", "kld_mean", "max", 0.1),
    ("batch", "traffic", "kld_mean", "max", 0.1),
    ("support", "traffic", "perplexity", "max_delta_pct", 5.0),
]


def _suites():
    from quantgate.config.gates import project_suites
    from quantgate.config.targets import Catalog

    return project_suites(Catalog(ROOT))


def _records(eval_dir: Path, model: str, suite: str) -> dict:
    return json.loads((eval_dir / model / f"{suite}.json").read_text())


def decide(eval_dir: Path, artifact: str, floor_spec: tuple, n: int | None = None) -> dict:
    """The gate's fixed-design decision on the first ``n`` windows (all: None)."""
    from quantgate.config.gates import Floor
    from quantgate.contracts.results import SampleDesign
    from quantgate.gate import floor as step
    from quantgate.gate.verdict import as_result
    from quantgate.stats.sequence import ordered_columns

    _, suite_name, metric, kind, value = floor_spec
    suite = _suites()[suite_name]
    art, src = _records(eval_dir, artifact, suite_name), _records(eval_dir, "source", suite_name)
    a_samples, s_samples = art["samples"][:n], src["samples"][:n]
    a, s = ordered_columns(suite, a_samples), ordered_columns(suite, s_samples)
    sampling = as_result(src).sampling or SampleDesign()
    floor = Floor(suite=suite_name, metric=metric, **{kind: value})
    p = step.plan(floor, suite.metrics()[metric], s, confidence=0.95, sampling=sampling)
    if isinstance(p, str):
        return {"status": "no bound", "why": p}
    m = step.measure(p, a, s, None)
    d = step.decide(p, m, advisory=False)
    end = m.interval.end(p.upper) if m.interval else math.nan
    margin = (p.limit - end) if p.upper else (end - p.limit)
    return {
        "status": d.status,
        "estimate": m.estimate,
        "end": end,
        "margin_of_tolerance": margin / p.tolerance if math.isfinite(margin) and p.tolerance else None,
        "windows": len(a_samples),
        "beyond": len(m.beyond),
    }


def design_of(eval_dir: Path) -> dict:
    """A design's window length, context, windows and scoring seconds, from its records and run.json."""
    run = json.loads((eval_dir / "run.json").read_text())
    sample = _records(eval_dir, "source", "wikitext")
    scored = int(sample["samples"][0]["tokens"])
    seconds = {
        m: sum(v for k, v in phases.items() if k in ("wikitext", "traffic"))
        for m, phases in run.get("seconds", {}).items()
        if m != "source"
    }
    return {
        "dir": eval_dir.name,
        "windows": len(sample["samples"]),
        "scored_per_window": scored,
        "seconds_per_artifact": seconds,
    }


def correlation(values: np.ndarray, lags: int = 3) -> list[float]:
    """Lag-1..lags autocorrelation of a series (windows in corpus order)."""
    x = values - values.mean()
    var = float(np.mean(x * x))
    return [float(np.mean(x[:-k] * x[k:]) / var) if var > 0 else 0.0 for k in range(1, lags + 1)]


def design_effect(values: np.ndarray, block: int) -> float:
    """Variance of the mean of ``block`` neighbouring windows over that of ``block`` independent ones."""
    blocks = len(values) // block
    means = values[: blocks * block].reshape(blocks, block).mean(axis=1)
    return float(np.var(means, ddof=1) / (np.var(values, ddof=1) / block)) if blocks > 1 else math.nan


def neighbours(eval_dir: Path, artifact: str, by_position: bool) -> dict:
    """Per-window KL, disagreement and NLL change in corpus order: their correlation and design effect."""
    out = {}
    for suite in ("wikitext", "traffic"):
        art, src = (
            _records(eval_dir, artifact, suite)["samples"],
            _records(eval_dir, "source", suite)["samples"],
        )
        pairs = sorted(
            zip(art, src, strict=True),
            key=lambda p: p[0].get("position", p[0]["item"]) if by_position else p[0]["item"],
        )
        series = {
            "kld_mean": np.array([a["kld_mean"] for a, _ in pairs]),
            "disagreement": np.array([1 - a["top1_agreement"] for a, _ in pairs]),
            "nll_change": np.array([(a["nll_sum"] - s["nll_sum"]) / a["tokens"] for a, s in pairs]),
        }
        out[suite] = {
            name: {"lag_correlation": correlation(v), "design_effect_16": design_effect(v, 16)}
            for name, v in series.items()
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("designs", type=Path, nargs="+")
    parser.add_argument("--consecutive", type=Path, default=None)
    parser.add_argument("--artifacts", default="hopper-fp8,rocm-cdna3-fp8")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    result = {"designs": [], "correlation": {}}
    for eval_dir in args.designs:
        design = design_of(eval_dir)
        design["floors"] = {}
        for artifact in args.artifacts.split(","):
            if not (eval_dir / artifact).is_dir():
                continue
            for spec in FLOORS:
                key = f"{artifact} {spec[0]} {spec[1]} {spec[2]} {spec[3]} {spec[4]:g}"
                by_n = {}
                total = design["windows"]
                for n in sorted({min(total, k) for k in (16, 32, 64, 128, 256, total)}):
                    by_n[n] = decide(eval_dir, artifact, spec, n)
                design["floors"][key] = by_n
        first = args.artifacts.split(",")[0]
        design["draw_order"] = neighbours(eval_dir, first, by_position=False)  # the order the test reads
        design["corpus_order"] = neighbours(
            eval_dir, first, by_position=True
        )  # the drawn windows by position
        result["designs"].append(design)
        print(json.dumps({k: v for k, v in design.items() if k != "floors"}), flush=True)
    if args.consecutive:
        result["correlation"]["consecutive"] = neighbours(
            args.consecutive, args.artifacts.split(",")[0], by_position=False
        )
        print(json.dumps(result["correlation"]), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
