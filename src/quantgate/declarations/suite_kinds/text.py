"""What configuration knows of the ``text`` suite kind: its YAML's model, the metrics a floor
may name on it and how many items a profile evaluates. The kind's runner
(``quantgate.evaluate.suites.text``) derives from ``TextDeclaration``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from quantgate.declarations.metrics import (
    Exceeds,
    Metric,
    Sums,
    perplexity,
    pooled_quantile,
    require_evaluated,
    weighted_mean,
    weighted_sums,
)
from quantgate.declarations.suites import DataSource, SuiteDeclaration, SuiteSpec, declare
from quantgate.runtime.frozen import Frozen

KLD_Q = 0.99  # the quantile kld_p99 reports


# natural per-window ranges: KL divergence and NLL have no upper bound; each floor's stated class
# (gates.yaml ``item_range``, quantgate.stats.linear) bounds the worse side and checks it
KLD_RANGE = (0.0, math.inf)


NLL_SUMS = Sums(
    lambda a, s: a["nll_sum"], lambda a, s: a["tokens"], (0.0, math.inf), log=True, weight="tokens"
)


METRICS = {
    "perplexity": Metric(
        False, True, "exp of the token-weighted mean NLL over windows", perplexity("nll_sum"), sums=NLL_SUMS
    ),
    "kld_mean": Metric(
        False,
        False,
        "token-weighted mean KL divergence to the source",
        weighted_mean("kld_mean", "tokens"),
        sums=weighted_sums("kld_mean", "tokens", KLD_RANGE),
    ),
    "kld_p99": Metric(
        False,
        False,
        "99th percentile of per-token KL divergence, pooled over windows",
        pooled_quantile(KLD_Q, "kld_top", "tokens"),
        exceeds=Exceeds("kld_top", "tokens", KLD_Q),
    ),
    "top1_agreement": Metric(
        True,
        False,
        "token-weighted top-1 agreement with the source",
        weighted_mean("top1_agreement", "tokens"),
        sums=weighted_sums("top1_agreement", "tokens", (0.0, 1.0)),
    ),
}


class TextSizes(Frozen):
    """One profile's sizes: the token budget, window length, unscored context, batch size."""

    tokens: PositiveInt = Field(description="tokens fed: tokens // seq_len windows are drawn")
    seq_len: PositiveInt = Field(description="tokens per window, context included")
    context: NonNegativeInt = Field(0, description="leading positions of each window fed but not scored")
    batch_size: PositiveInt = 4

    @model_validator(mode="after")
    def _scores_something(self) -> TextSizes:
        if self.context + 2 > self.seq_len:
            raise ValueError(
                f"context {self.context} leaves no scored position in a window of {self.seq_len}"
            )
        return self

    @property
    def scored(self) -> int:
        """Positions scored per window: each predicts the next token, after the context."""
        return self.seq_len - 1 - self.context


class TrafficCorpus(Frozen):
    """The calibration domain as a corpus: the traffic log's prompts the calibration set did not use."""

    calibration_spec: str = Field(description="calibration spec whose traffic log is the domain")


class TextSpec(SuiteSpec):
    """A text suite's YAML: a public file (``data``) or the calibration domain (``traffic``)."""

    kind: Literal["text"]
    data: DataSource | None = None
    traffic: TrafficCorpus | None = None
    top_k: PositiveInt = 32
    profiles: dict[str, TextSizes]


@declare("text")
class TextDeclaration(SuiteDeclaration):
    """The ``text`` kind as configuration sees it."""

    spec: TextSpec
    spec_model = TextSpec

    def items(self, profile: str) -> int:
        """Windows drawn: ``tokens // seq_len``."""
        sizes = self.spec.sizes(profile)
        return sizes.tokens // sizes.seq_len

    def metrics(self) -> dict[str, Metric]:
        """Perplexity (a level), KL divergence, its p99 and top-1 agreement (comparisons)."""
        return dict(METRICS)

    def columns(self, sample: Mapping[str, Any]) -> dict[str, float | list[float]]:
        """A window's tokens, NLL sum, mean KL, top-1 agreement and largest per-token KL values."""
        require_evaluated(sample)
        cols: dict[str, float | list[float]] = {
            k: float(sample[k]) for k in ("tokens", "nll_sum", "kld_mean", "top1_agreement")
        }
        if "kld_top" in sample:  # records from before it was kept: kld_p99 floors report it missing
            cols["kld_top"] = [float(v) for v in sample["kld_top"]]
        return cols
