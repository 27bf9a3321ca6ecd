"""What configuration knows of the ``domain`` suite kind: its YAML's model, the metrics a floor
may name on it, its tenant and how many items a profile evaluates. The kind's runner
(``quantgate.evaluate.suites.domain``) derives from ``DomainDeclaration``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, PositiveInt

from quantgate.declarations.metrics import Metric, Sums, correctness, perplexity, require_evaluated
from quantgate.declarations.suites import SuiteDeclaration, SuiteSpec, declare
from quantgate.runtime.frozen import Frozen

PERPLEXITY = Metric(
    False,
    True,
    "exp of the token-weighted mean NLL over items",
    perplexity("nll"),
    # per-item ranges for sequential evaluation, as the text suites declare them
    sums=Sums(lambda a, s: a["nll"], lambda a, s: a["tokens"], (0.0, math.inf), log=True, weight="tokens"),
)


class DomainSizes(Frozen):
    """One profile's sizes: items used, answer length, batch size."""

    items: PositiveInt
    max_new_tokens: PositiveInt = 64
    batch_size: PositiveInt = 8


class DomainSpec(SuiteSpec):
    """A domain suite's YAML: its tenant, its JSONL, the metric, and how prompts are framed."""

    kind: Literal["domain"]
    tenant: str
    data: str = Field(description="JSONL with prompt and reference, relative to the suite file")
    metric: Literal["exact", "contains", "perplexity"]
    prompt_format: Literal["chat", "raw"] = "chat"
    profiles: dict[str, DomainSizes]


@declare("domain")
class DomainDeclaration(SuiteDeclaration):
    """The ``domain`` kind as configuration sees it."""

    spec: DomainSpec
    spec_model = DomainSpec

    @property
    def tenant(self) -> str | None:
        """The tenant this suite belongs to."""
        return self.spec.tenant

    def metrics(self) -> dict[str, Metric]:
        """Perplexity for a perplexity suite, else accuracy and the paired flip measures."""
        return {"perplexity": PERPLEXITY} if self.spec.metric == "perplexity" else correctness("accuracy")

    def columns(self, sample: Mapping[str, Any]) -> dict[str, float]:
        """An item's NLL and tokens (perplexity), or its correctness; ItemError for one not evaluated."""
        require_evaluated(sample)
        if self.spec.metric == "perplexity":
            return {"nll": float(sample["nll"]), "tokens": float(sample["tokens"])}
        return {"correct": float(bool(sample["correct"]))}
