"""Builders of synthetic evaluation results for the gate tests (imported by name, not a fixture)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from quantgate.config.gates import project_suites
from quantgate.config.targets import Catalog

REPO = Path(__file__).resolve().parents[3]


def edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


# the repository's suites, as the gate reads them (through the suite-kind registry)
_SUITES = project_suites(Catalog(REPO))
TEXT, GSM8K = _SUITES["wikitext"], _SUITES["gsm8k"]


def text_result(kld, agree=None, nll=None, tokens=None, items=None) -> dict:
    """A text-suite result with one window per value."""
    kld = np.asarray(kld, dtype=float)
    n = len(kld)
    tokens = np.full(n, 511.0) if tokens is None else np.asarray(tokens, dtype=float)
    agree = np.full(n, 0.9) if agree is None else np.asarray(agree, dtype=float)
    nll = tokens * 3.4 if nll is None else np.asarray(nll, dtype=float)
    items = range(n) if items is None else items
    samples = [
        {
            "item": int(i),
            "tokens": float(t),
            "nll_sum": float(l),
            "kld_mean": float(k),
            "kld_p99": float(k) * 8,
            "top1_agreement": float(a),
        }
        for i, t, l, k, a in zip(items, tokens, nll, kld, agree, strict=True)
    ]
    metrics = {
        "perplexity": float(np.exp(nll.sum() / tokens.sum())),
        "kld_mean": float((kld * tokens).sum() / tokens.sum()),
        "kld_p99": float(np.percentile(kld * 8, 99)),
        "top1_agreement": float((agree * tokens).sum() / tokens.sum()),
    }
    return {"suite": "wikitext", "kind": "text", "metrics": metrics, "samples": samples}


def gsm8k_result(correct, source_correct, items=None) -> dict:
    items = range(len(correct)) if items is None else items
    samples = [
        {
            "item": int(i),
            "correct_flexible-extract": bool(c),
            "correct_strict-match": bool(c),
            "source_correct": bool(s),
        }
        for i, c, s in zip(items, correct, source_correct, strict=True)
    ]
    acc = float(np.mean(correct))
    return {"suite": "gsm8k", "kind": "gsm8k", "metrics": {"accuracy": acc}, "samples": samples}
