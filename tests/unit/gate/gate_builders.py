"""Builders of synthetic evaluation results for the gate tests (imported by name, not a fixture)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from quantgate.config.gates import project_suites
from quantgate.config.targets import Catalog
from quantgate.declarations.metrics import tail_size

REPO = Path(__file__).resolve().parents[3]


def edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


# the repository's suites, as the gate reads them (through the suite-kind registry)
_SUITES = project_suites(Catalog(REPO))
TEXT, GSM8K, CHAIN = _SUITES["wikitext"], _SUITES["gsm8k"], _SUITES["long-chain"]


def per_token(mean: float, tokens: int) -> np.ndarray:
    """Per-token KL values of one window with the given mean: exponential quantiles, deterministic."""
    u = (np.arange(tokens) + 0.5) / tokens
    return mean * -np.log1p(-u)


def text_result(kld, agree=None, nll=None, tokens=None, items=None, per_token_kld=None) -> dict:
    """A text-suite result with one window per value, shaped as the text suite records it
    (each window keeps its largest per-token KL values, ``kld_top``, for the pooled p99)."""
    kld = np.asarray(kld, dtype=float)
    n = len(kld)
    tokens = np.full(n, 511.0) if tokens is None else np.asarray(tokens, dtype=float)
    agree = np.full(n, 0.9) if agree is None else np.asarray(agree, dtype=float)
    nll = tokens * 3.4 if nll is None else np.asarray(nll, dtype=float)
    items = range(n) if items is None else items
    values = per_token_kld or [per_token(k, int(t)) for k, t in zip(kld, tokens, strict=True)]
    keep = tail_size(0.99, n, max(len(v) for v in values))
    samples = [
        {
            "item": int(i),
            "tokens": float(t),
            "nll_sum": float(l),
            "kld_mean": float(k),
            "kld_p99": float(np.percentile(v, 99)),
            "top1_agreement": float(a),
            "kld_top": sorted(map(float, v), reverse=True)[:keep],
        }
        for i, t, l, k, a, v in zip(items, tokens, nll, kld, agree, values, strict=True)
    ]
    metrics = {
        "perplexity": float(np.exp(nll.sum() / tokens.sum())),
        "kld_mean": float((kld * tokens).sum() / tokens.sum()),
        "kld_p99": float(np.percentile(np.concatenate(values), 99)),
        "top1_agreement": float((agree * tokens).sum() / tokens.sum()),
    }
    return {"suite": "wikitext", "kind": "text", "metrics": metrics, "samples": samples}


def chain_result(depth_agreement, depth_tokens=None, agree=None) -> dict:
    """A long-chain result with one trace per value of agreement in the deepest bin."""
    deep = np.asarray(depth_agreement, dtype=float)
    n = len(deep)
    tokens = np.full(n, 48.0) if depth_tokens is None else np.asarray(depth_tokens, dtype=float)
    agree = deep if agree is None else np.asarray(agree, dtype=float)
    samples = [
        {
            "item": i,
            "trace_tokens": 192,
            "kld_mean": 0.01,
            "top1_agreement": float(a),
            "first_divergence": 10,
            "accepted_per_step_k4": 4.0,
            "depth_tokens": int(t),
            "depth_agreement": float(d),
        }
        for i, (a, t, d) in enumerate(zip(agree, tokens, deep, strict=True))
    ]
    pooled = float((deep * tokens).sum() / tokens.sum())
    return {
        "suite": "long-chain",
        "kind": "long_chain",
        "metrics": {"agreement_at_depth": pooled},
        "samples": samples,
    }


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
