"""What configuration knows of the ``long_chain`` suite kind: its YAML's model, the metrics a floor
may name on it and how many items a profile evaluates. The kind's runner
(``quantgate.evaluate.suites.long_chain``) derives from ``LongChainDeclaration``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, NonNegativeInt, PositiveInt

from quantgate.declarations.metrics import (
    Metric,
    mean,
    mean_sums,
    require_evaluated,
    weighted_mean,
    weighted_sums,
)
from quantgate.declarations.suites import DataSource, SuiteDeclaration, SuiteSpec, declare
from quantgate.runtime.frozen import Frozen

KLD_RANGE = (0.0, math.inf)  # a trace's mean KL: no natural bound (the floor's class bounds it, as text's)


METRICS = {
    "kld_mean": Metric(
        False,
        False,
        "trace-token-weighted mean KL divergence",
        weighted_mean("kld_mean", "trace_tokens"),
        sums=weighted_sums("kld_mean", "trace_tokens", KLD_RANGE),
    ),
    "top1_agreement": Metric(
        True,
        False,
        "trace-token-weighted top-1 agreement",
        weighted_mean("top1_agreement", "trace_tokens"),
        sums=weighted_sums("top1_agreement", "trace_tokens", (0.0, 1.0)),
    ),
    "agreement_at_depth": Metric(
        True,
        False,
        "top-1 agreement in the deepest bin, weighted by each trace's tokens there",
        weighted_mean("depth_agreement", "depth_tokens"),
        sums=weighted_sums("depth_agreement", "depth_tokens", (0.0, 1.0)),
    ),
    "first_divergence_mean": Metric(
        True,
        False,
        "mean free-running first divergence position",
        mean("first_divergence"),
        sums=mean_sums("first_divergence", (0.0, math.inf)),
    ),
}


def acceptance(k: int) -> Metric:
    """Draft acceptance with ``k`` draft tokens: a level (ratio floors apply), higher is better."""
    return Metric(
        True,
        True,
        f"draft tokens accepted per verification step with k={k}, per-trace mean weighted by trace tokens",
        weighted_mean(f"accepted_k{k}", "trace_tokens"),
        sums=weighted_sums(
            f"accepted_k{k}", "trace_tokens", (0.0, float(k + 1))
        ),  # tokens per step: at most k + 1
    )


class ChainSizes(Frozen):
    """One profile's sizes: traces, tokens per trace, depth bins, batch size."""

    traces: PositiveInt
    trace_tokens: PositiveInt
    bins: PositiveInt = 4
    batch_size: PositiveInt = 4


class LongChainSpec(SuiteSpec):
    """A long-chain suite's YAML: question data, prompt template, draft sizes, top-k kept."""

    kind: Literal["long_chain"]
    data: DataSource
    prompt: str = Field(description="template with {question}")
    offset: NonNegativeInt = Field(0, description="first record used (keep clear of few-shot items)")
    draft_k: list[PositiveInt] = Field(default_factory=lambda: [4])
    top_k: PositiveInt = 32
    profiles: dict[str, ChainSizes]


@declare("long_chain")
class LongChainDeclaration(SuiteDeclaration):
    """The ``long_chain`` kind as configuration sees it."""

    spec: LongChainSpec
    spec_model = LongChainSpec

    def items(self, profile: str) -> int:
        """Traces: one per problem drawn."""
        return int(self.spec.sizes(profile).traces)

    def metrics(self) -> dict[str, Metric]:
        """KL, agreement, first divergence (comparisons) and acceptance per draft size (levels)."""
        return {**METRICS, **{f"acceptance_k{k}": acceptance(k) for k in self.spec.draft_k}}

    def columns(self, sample: Mapping[str, Any]) -> dict[str, float]:
        """A trace's tokens, mean KL, agreement, first divergence and acceptance per draft size."""
        require_evaluated(sample)
        cols = {
            k: float(sample[k]) for k in ("trace_tokens", "kld_mean", "top1_agreement", "first_divergence")
        }
        for k in self.spec.draft_k:
            cols[f"accepted_k{k}"] = float(sample[f"accepted_per_step_k{k}"])
        for field in ("depth_tokens", "depth_agreement"):  # absent from records older than them
            if field in sample:
                cols[field] = float(sample[field])
        return cols
