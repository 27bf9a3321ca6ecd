"""What configuration knows of the ``gsm8k`` suite kind: its YAML's model, the metrics a floor
may name on it and how many items a profile evaluates. The kind's runner
(``quantgate.evaluate.suites.gsm8k``) derives from ``Gsm8kDeclaration``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import NonNegativeInt, PositiveInt

from quantgate.declarations.metrics import Metric, correctness, require_evaluated
from quantgate.declarations.suites import DataSource, SuiteDeclaration, SuiteSpec, declare
from quantgate.runtime.frozen import Frozen


class Gsm8kSizes(Frozen):
    """One profile's sizes: items sampled, generation length, batch and context length."""

    items: PositiveInt
    max_gen_toks: PositiveInt = 256
    batch_size: PositiveInt = 8
    max_length: PositiveInt = 2048


class Gsm8kData(Frozen):
    """The test split (items) and the train split (lm-eval's few-shot exemplars)."""

    test: DataSource
    train: DataSource


class Gsm8kSpec(SuiteSpec):
    """A GSM8K suite's YAML: data, few-shot count, and the filter whose correctness is paired."""

    kind: Literal["gsm8k"]
    data: Gsm8kData
    num_fewshot: NonNegativeInt = 5
    primary_filter: Literal["strict-match", "flexible-extract"] = "flexible-extract"
    profiles: dict[str, Gsm8kSizes]


@declare("gsm8k")
class Gsm8kDeclaration(SuiteDeclaration):
    """The ``gsm8k`` kind as configuration sees it."""

    spec: Gsm8kSpec
    spec_model = Gsm8kSpec

    def metrics(self) -> dict[str, Metric]:
        """Accuracy (a level) and the paired flip measures."""
        return correctness("accuracy")

    def columns(self, sample: Mapping[str, Any]) -> dict[str, float]:
        """An item's correctness under the primary filter; ItemError for an item not evaluated."""
        require_evaluated(sample)
        return {"correct": float(bool(sample[f"correct_{self.spec.primary_filter}"]))}
