"""What the gate can measure on each suite kind, from the per-item records a suite writes.

A measure is a statistic over per-item columns, paired item by item with the source. Every
measure declares whether higher or lower is better, and whether it is a *level* (a property of
one model, such as perplexity or accuracy, so a ratio with the source's level means something:
``max_delta_pct``, ``min_recovery``) or already a *comparison* with the source (KL divergence,
agreement, flips: only ``max`` / ``min`` apply). A measure without usable per-item records is
``point_only``: the gate uses the suite's reported metric and says that no interval exists.

Per-item columns by kind (what ``quantgate eval`` writes in ``samples``):

- text: ``tokens``, ``nll_sum``, ``kld_mean``, ``top1_agreement`` per window; means are
  token-weighted, perplexity is ``exp(sum nll / sum tokens)``.
- gsm8k / humaneval / domain: ``correct`` per item (gsm8k: ``correct_<primary filter>``,
  humaneval: ``passed``), paired with the source's record of the same item; a domain suite
  scored by likelihood has ``nll`` and ``tokens`` instead.
- long_chain: ``trace_tokens``, ``kld_mean``, ``top1_agreement``, ``first_divergence`` and
  ``accepted_per_step_k<k>`` per trace; means are weighted by trace tokens.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

Columns = dict[str, np.ndarray]


@dataclass(frozen=True)
class SuiteInfo:
    """What the gate needs to know about one suite (from its YAML under eval_suites/)."""

    name: str
    kind: str
    tenant: str | None = None  # domain suites belong to one tenant
    primary_filter: str = "flexible-extract"  # gsm8k
    domain_metric: str = "contains"  # domain: exact | contains | perplexity
    draft_k: tuple[int, ...] = (4,)  # long_chain


@dataclass(frozen=True)
class Measure:
    higher_is_better: bool
    level: bool
    fn: Callable[[Columns, Columns, int], np.ndarray] | None  # (artifact, source, axis) -> value
    how: str  # how the estimate is computed, for the reason sentence
    point_only: bool = False

    @property
    def direction(self) -> str:
        return "higher is better" if self.higher_is_better else "lower is better"


def _wmean(value: str, weight: str):
    return lambda a, s, axis: np.sum(a[value] * a[weight], axis=axis) / np.sum(a[weight], axis=axis)


def _ppl(nll: str):
    return lambda a, s, axis: np.exp(np.sum(a[nll], axis=axis) / np.sum(a["tokens"], axis=axis))


_ACC = Measure(True, True, lambda a, s, axis: np.mean(a["correct"], axis=axis), "fraction of items correct")
_FLIP_RATE = Measure(
    False, False, lambda a, s, axis: np.mean(a["correct"] != s["correct"], axis=axis),
    "fraction of items whose correctness changed against the source",
)
_FLIPS_LOST = Measure(
    False, False, lambda a, s, axis: np.sum((s["correct"] > 0) & (a["correct"] == 0), axis=axis).astype(float),
    "items the source got right and the artifact got wrong",
)
_ACC_DELTA = Measure(
    True, False, lambda a, s, axis: np.mean(a["correct"], axis=axis) - np.mean(s["correct"], axis=axis),
    "paired accuracy difference, artifact minus source",
)


def _correctness(acc_name: str) -> dict[str, Measure]:
    return {acc_name: _ACC, "flip_rate": _FLIP_RATE, "flips_lost": _FLIPS_LOST, f"{acc_name}_delta": _ACC_DELTA}


_TEXT = {
    "perplexity": Measure(False, True, _ppl("nll_sum"), "exp of the token-weighted mean NLL over windows"),
    "kld_mean": Measure(False, False, _wmean("kld_mean", "tokens"), "token-weighted mean KL divergence to the source"),
    "kld_p99": Measure(False, False, None, "99th percentile of per-token KL divergence", point_only=True),
    "top1_agreement": Measure(True, False, _wmean("top1_agreement", "tokens"), "token-weighted top-1 agreement with the source"),
}

_LONG_CHAIN = {
    "kld_mean": Measure(False, False, _wmean("kld_mean", "trace_tokens"), "trace-token-weighted mean KL divergence"),
    "top1_agreement": Measure(True, False, _wmean("top1_agreement", "trace_tokens"), "trace-token-weighted top-1 agreement"),
    "agreement_at_depth": Measure(True, False, None, "top-1 agreement in the deepest bin", point_only=True),
    "first_divergence_mean": Measure(
        True, False, lambda a, s, axis: np.mean(a["first_divergence"], axis=axis), "mean free-running first divergence position"
    ),
}

_ACCEPT = re.compile(r"acceptance_k(\d+)$")


def _acceptance(k: int) -> Measure:
    return Measure(
        True, True, _wmean(f"accepted_k{k}", "trace_tokens"),
        f"draft tokens accepted per verification step with k={k}, per-trace mean weighted by trace tokens",
    )


def measures_for(suite: SuiteInfo) -> dict[str, Measure]:
    """Every metric a floor may name on this suite."""
    if suite.kind == "text":
        return dict(_TEXT)
    if suite.kind == "gsm8k":
        return _correctness("accuracy")
    if suite.kind == "humaneval":
        return _correctness("pass_at_1")
    if suite.kind == "domain":
        if suite.domain_metric == "perplexity":
            return {"perplexity": Measure(False, True, _ppl("nll"), "exp of the token-weighted mean NLL over items")}
        return _correctness("accuracy")
    if suite.kind == "long_chain":
        return {**_LONG_CHAIN, **{f"acceptance_k{k}": _acceptance(k) for k in suite.draft_k}}
    return {}


def item_columns(suite: SuiteInfo, sample: dict[str, Any]) -> dict[str, float]:
    """One per-item record as numeric columns; KeyError when a field is absent."""
    if suite.kind == "text":
        return {k: float(sample[k]) for k in ("tokens", "nll_sum", "kld_mean", "top1_agreement")}
    if suite.kind == "long_chain":
        cols = {k: float(sample[k]) for k in ("trace_tokens", "kld_mean", "top1_agreement", "first_divergence")}
        for k in suite.draft_k:
            cols[f"accepted_k{k}"] = float(sample[f"accepted_per_step_k{k}"])
        return cols
    if suite.kind == "domain" and suite.domain_metric == "perplexity":
        return {"nll": float(sample["nll"]), "tokens": float(sample["tokens"])}
    key = {"gsm8k": f"correct_{suite.primary_filter}", "humaneval": "passed"}.get(suite.kind, "correct")
    return {"correct": float(bool(sample[key]))}
