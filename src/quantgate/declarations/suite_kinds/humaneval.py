"""What configuration knows of the ``humaneval`` suite kind: its YAML's model, the metrics a floor
may name on it and how many items a profile evaluates. The kind's runner
(``quantgate.evaluate.suites.humaneval``) derives from ``HumanEvalDeclaration``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, PositiveFloat, PositiveInt

from quantgate.declarations.metrics import Metric, correctness, require_evaluated
from quantgate.declarations.suites import SuiteDeclaration, SuiteSpec, declare
from quantgate.runtime.frozen import Frozen


class HumanEvalSizes(Frozen):
    """One profile's sizes: problems sampled, generation length, batch and context length."""

    items: PositiveInt
    max_gen_toks: PositiveInt = 512
    batch_size: PositiveInt = 8
    max_length: PositiveInt = 2048


class SandboxLimits(Frozen):
    """Limits of each sandboxed run: wall-clock seconds, address space (SI MB), threads.

    ``max_processes`` is ``RLIMIT_NPROC``, which counts threads: the sandbox refuses new
    processes outright (each would have an address space of its own).
    """

    # bounded: a limit beyond what a kernel takes (1e12 s overflows a timer) is a typo, not a policy
    timeout_s: PositiveFloat = Field(default=10.0, le=3600.0, description="per completion, at most an hour")
    memory_mb: PositiveInt = Field(default=512, le=65_536, description="address space, at most 64 GB")
    max_processes: PositiveInt = Field(
        default=16, le=4096, description="RLIMIT_NPROC (threads), at most 4096"
    )


class HumanEvalSpec(SuiteSpec):
    """A HumanEval suite's YAML: sandbox limits and profiles."""

    kind: Literal["humaneval"]
    sandbox: SandboxLimits = SandboxLimits()
    profiles: dict[str, HumanEvalSizes]


@declare("humaneval")
class HumanEvalDeclaration(SuiteDeclaration):
    """The ``humaneval`` kind as configuration sees it."""

    spec: HumanEvalSpec
    spec_model = HumanEvalSpec

    def metrics(self) -> dict[str, Metric]:
        """pass@1 (a level) and the paired flip measures."""
        return correctness("pass_at_1")

    def columns(self, sample: Mapping[str, Any]) -> dict[str, float]:
        """A problem's pass or fail; ItemError for a program that could not be run."""
        require_evaluated(sample)
        return {"correct": float(bool(sample["passed"]))}
