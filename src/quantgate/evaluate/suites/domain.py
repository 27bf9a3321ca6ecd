"""Tenant domain suites: a tenant's own JSONL of (prompt, reference), scored by a declared metric.

``exact`` and ``contains`` compare the greedy answer with the reference (case- and
whitespace-normalized); ``perplexity`` scores the reference as a continuation of the prompt.
A new domain suite is a YAML beside this kind and a JSONL beside the YAML: no code. A domain
suite belongs to its tenant: no other tenant's floor may name it.
"""

from __future__ import annotations

import json
import math
import random
import re

from quantgate.config import file_digest
from quantgate.declarations.suite_kinds.domain import DomainDeclaration, DomainSpec
from quantgate.evaluate.paired import flip_metrics
from quantgate.evaluate.suites.kind import DECODE, EvalContext, SuiteKind, SuiteResult, register
from quantgate.runtime.errors import ConfigFileError


def _normalize(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def matches(metric: str, answer: str, reference: str) -> bool:
    """``exact``: normalized answer equals the reference; ``contains``: it contains it."""
    a, r = _normalize(answer), _normalize(reference)
    return a == r if metric == "exact" else r in a


@register("domain")
class DomainSuite(DomainDeclaration, SuiteKind):
    """A tenant's own (prompt, reference) set, scored by exact, contains or perplexity."""

    spec_model = DomainSpec

    def cost(self, profile: str) -> float:
        """Each question's answer generated."""
        sizes = self.spec.sizes(profile)
        return float(sizes.items * sizes.max_new_tokens) * DECODE

    spec: DomainSpec

    def inputs(self) -> list[str]:
        """The items file's bytes: an edited question is a new suite."""
        return [file_digest((self.path.parent / self.spec.data).resolve())]

    def _records(self, ctx: EvalContext) -> list[dict]:
        path = (self.path.parent / self.spec.data).resolve()
        if not path.exists():
            raise ConfigFileError(
                self.path, f"data file {path} does not exist", "fix 'data:' or add the file"
            )
        records = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                records.append({"prompt": str(record["prompt"]), "reference": str(record["reference"])})
            except (ValueError, KeyError, TypeError):
                raise ConfigFileError(
                    f"{path}:{n}", "not a JSON object with prompt and reference", "fix the line"
                ) from None
        # a seeded random sample (in file order) when the profile takes fewer items than the file
        # holds: the gate's bounds take items as draws from the tenant's set, not its first lines
        n = min(self.spec.sizes(ctx.profile).items, len(records))
        return [records[i] for i in sorted(random.Random(self.spec.seed).sample(range(len(records)), n))]

    def _prompt(self, tokenizer, text: str) -> list[int]:
        from quantgate.evaluate.generation import chat_prompt

        return (
            chat_prompt(tokenizer, text)
            if self.spec.prompt_format == "chat"
            else tokenizer(text)["input_ids"]
        )

    def _run(self, ctx: EvalContext, model) -> list[dict]:
        from quantgate.evaluate.generation import greedy_with_progress

        sizes = self.spec.sizes(ctx.profile)
        records = self._records(ctx)
        prompts = [self._prompt(model.tokenizer, r["prompt"]) for r in records]
        if self.spec.metric == "perplexity":
            return [
                {"item": i, "nll": nll, "tokens": n}
                for i, (nll, n) in enumerate(self._nll(model, prompts, records))
            ]
        outputs = greedy_with_progress(
            ctx.progress,
            f"{self.spec.name}: {len(records)} answers",
            model.model,
            model.tokenizer,
            prompts,
            max_new_tokens=sizes.max_new_tokens,
            batch_size=sizes.batch_size,
        )
        samples = []
        for i, (record, out) in enumerate(zip(records, outputs, strict=True)):
            answer = model.tokenizer.decode(out, skip_special_tokens=True)
            samples.append(
                {
                    "item": i,
                    "answer": answer,
                    "correct": matches(self.spec.metric, answer, record["reference"]),
                }
            )
        return samples

    def _nll(self, model, prompts, records) -> list[tuple[float, int]]:
        import torch

        found = []
        with torch.inference_mode():
            for prompt, record in zip(prompts, records, strict=True):
                target = model.tokenizer(record["reference"], add_special_tokens=False)["input_ids"]
                ids = torch.tensor([prompt + target])
                logp = torch.log_softmax(
                    model.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float(), -1
                )
                found.append((float(-logp.gather(1, torch.tensor(target)[:, None]).sum()), len(target)))
        return found

    def _result(self, samples: list[dict], reference: list[dict]) -> SuiteResult:
        if self.spec.metric == "perplexity":
            tokens = sum(s["tokens"] for s in samples)
            metrics: dict[str, float | None] = {
                "perplexity": math.exp(sum(s["nll"] for s in samples) / tokens),
                "items": float(len(samples)),
            }
        else:
            correct = [s["correct"] for s in samples]
            metrics = {
                "accuracy": sum(correct) / len(correct),
                "items": float(len(samples)),
                **flip_metrics([r["correct"] for r in reference], correct),
            }
        return SuiteResult(
            self.spec.name,
            "domain",
            metrics,
            samples,
            [f"tenant {self.spec.tenant}, metric {self.spec.metric}"],
        )

    def reference(self, ctx: EvalContext, source) -> tuple[list[dict], SuiteResult]:
        """The source's per-item records (what artifacts are paired with) and its result."""
        samples = self._run(ctx, source)
        return samples, self._result(samples, samples)

    def score(self, ctx: EvalContext, model, reference: list[dict]) -> SuiteResult:
        """Run ``model`` on the same items; flips against the source's records."""
        return self._result(self._run(ctx, model), reference)
