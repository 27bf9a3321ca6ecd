"""GSM8K: final-number exact match as lm-eval's gsm8k task extracts it, paired with the source.

lm-eval supplies the prompt format, the few-shot exemplars from the train split, the stop
sequences and both answer filters (``strict-match`` wants ``#### N``; ``flexible-extract``
takes the last number). We pick the items (a seeded sample of the test split, so two runs with
different seeds are two independent subsets of the same size), pair them with the source,
and count flips: items whose correctness changed. A small model solves almost none, so
accuracy ratios are noise there; flips stay meaningful at any size. The gate pairs items by
their correctness under the primary filter. An item lm-eval returned no result for is recorded
with ``"error"`` (not evaluated), never as a wrong answer, and counts in no metric.
"""

from __future__ import annotations

import random

from quantgate.declarations.metrics import ERROR, item_error
from quantgate.declarations.suite_kinds.gsm8k import Gsm8kDeclaration, Gsm8kSpec
from quantgate.evaluate.data import jsonl_file, load_jsonl_records
from quantgate.evaluate.lmeval import run_task, task_config
from quantgate.evaluate.paired import flip_metrics
from quantgate.evaluate.suites.kind import DECODE, EvalContext, SuiteKind, SuiteResult, register

FILTERS = ("strict-match", "flexible-extract")  # lm-eval's gsm8k answer filters; both are reported


def item_records(logs: list[dict], items: list[int]) -> list[dict]:
    """One record per requested item from lm-eval's per-sample logs (one log per item and filter).

    lm-eval logs each item's index in the test split as ``doc_id`` (one of ``items``). An item
    without a log for every filter in ``FILTERS`` is recorded with ``"error"``: lm-eval gave no
    answer to score, which is not a wrong answer.
    """
    per_item: dict[int, dict] = {}
    for log in logs:
        doc = int(log["doc_id"])
        record = per_item.setdefault(doc, {"item": doc, "doc_id": doc})
        record[f"correct_{log['filter']}"] = bool(float(log["exact_match"]))
        record[f"extracted_{log['filter']}"] = str(log["filtered_resps"][0]) if log["filtered_resps"] else ""
        record["response"] = str(log["resps"][0][0]) if log["resps"] else ""
    for doc in items:
        record = per_item.setdefault(doc, {"item": doc, "doc_id": doc})
        absent = [f for f in FILTERS if f"correct_{f}" not in record]
        if absent:
            record[ERROR] = f"lm-eval returned no {' or '.join(absent)} result for it"
    return [per_item[k] for k in sorted(per_item)]


@register("gsm8k")
class Gsm8kSuite(Gsm8kDeclaration, SuiteKind):
    """GSM8K through lm-eval's task, accuracy and flips paired with the source.

    No ``subset`` (it runs all its items in the sequential design too): lm-eval draws each item's
    few-shot examples from one random generator in item order, so the same item in another set
    of items gets other shots, and would not be paired with the prompt the source answered.
    """

    spec_model = Gsm8kSpec

    def cost(self, profile: str) -> float:
        """Each item's few-shot prompt prefilled (about half the context) and its answer generated."""
        sizes = self.spec.sizes(profile)
        return float(sizes.items) * (sizes.max_length / 2 + sizes.max_gen_toks * DECODE)

    spec: Gsm8kSpec

    def _items(self, ctx: EvalContext) -> list[int]:
        total = len(load_jsonl_records(ctx.data, self.spec.data.test))
        n = min(self.spec.sizes(ctx.profile).items, total)
        return sorted(random.Random(self.spec.seed).sample(range(total), n))

    def _run(self, ctx: EvalContext, model) -> list[dict]:
        sizes = self.spec.sizes(ctx.profile)
        items = self._items(ctx)
        files = {
            "train": str(jsonl_file(ctx.data, self.spec.data.train, ctx.cache_dir)),
            "test": str(jsonl_file(ctx.data, self.spec.data.test, ctx.cache_dir)),
        }
        with ctx.progress.task(f"{self.spec.name}: {len(items)} items", total=None):
            logs = run_task(
                model.model,
                model.tokenizer,
                task_config("gsm8k/gsm8k.yaml"),
                data_files=files,
                cache_dir=ctx.cache_dir,
                items=items,
                batch_size=sizes.batch_size,
                max_length=sizes.max_length,
                max_gen_toks=sizes.max_gen_toks,
                num_fewshot=self.spec.num_fewshot,
            )
        return item_records(logs, items)

    def _result(self, samples: list[dict], reference: list[dict]) -> SuiteResult:
        key = f"correct_{self.spec.primary_filter}"
        done = [s for s in samples if item_error(s) is None]
        both = [
            (r[key], s[key])
            for s, r in zip(samples, reference, strict=True)
            if item_error(s) is None and item_error(r) is None
        ]
        flips = flip_metrics([r for r, _ in both], [a for _, a in both])

        def share(field: str) -> float | None:
            return sum(s[field] for s in done) / len(done) if done else None

        metrics = {
            "accuracy": share(key),
            "accuracy_strict": share("correct_strict-match"),
            "accuracy_flexible": share("correct_flexible-extract"),
            "items": float(len(samples)),
            "errors": float(len(samples) - len(done)),
            **{k: v if both else None for k, v in flips.items()},
        }
        for s, r in zip(samples, reference, strict=True):
            s["source_correct"] = r.get(key) if item_error(r) is None else None
        return SuiteResult(
            self.spec.name, "gsm8k", metrics, samples, [f"primary filter: {self.spec.primary_filter}"]
        )

    def reference(self, ctx: EvalContext, source) -> tuple[list[dict], SuiteResult]:
        """The source's per-item records (what artifacts are paired with) and its result."""
        samples = self._run(ctx, source)
        return samples, self._result([dict(s) for s in samples], samples)

    def score(self, ctx: EvalContext, model, reference: list[dict]) -> SuiteResult:
        """Run ``model`` on the same items; flips against the source's records."""
        return self._result(self._run(ctx, model), reference)
