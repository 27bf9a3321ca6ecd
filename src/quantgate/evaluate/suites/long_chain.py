"""Long-chain reasoning: does per-token error compound over a long trace?

Short benchmarks miss what long reasoning exposes: a small per-token divergence, repeated over
thousands of decode steps, sends a chain somewhere else. The source writes greedy traces once
(cached with the reference). Each artifact is teacher-forced on them (KL divergence and top-1
agreement at every position, binned by depth: a rising KL or falling agreement in later bins is
compounding error), run free from the same prompts (``first_divergence``), and scored as a
speculative-decoding draft (``accepted_per_step``). Each trace records its tokens and agreement in
the deepest bin any trace reaches (``depth_tokens``, ``depth_agreement``), so the gate bounds
``agreement_at_depth`` by resampling traces.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import numpy as np

from quantgate.declarations.suite_kinds.long_chain import LongChainDeclaration, LongChainSpec
from quantgate.evaluate.data import load_jsonl_records
from quantgate.evaluate.suites.kind import DECODE, EvalContext, SuiteKind, SuiteResult, register

if TYPE_CHECKING:
    from quantgate.evaluate.scoring import Scores


def accepted_per_step(agree: list[bool], k: int) -> float:
    """Expected tokens per verification step of greedy speculative decoding with k drafts.

    Under greedy verification a draft's proposal is accepted while it equals the target's
    choice, and along the accepted prefix the draft is conditioned on exactly the source's
    tokens, so teacher-forced agreement (``agree``) on the source's trace gives acceptance exactly.
    """
    t = steps = tokens = 0
    while t < len(agree):
        n = 0
        while n < k and t + n < len(agree) and agree[t + n]:
            n += 1
        produced = min(n + 1, len(agree) - t)
        t += produced
        tokens += produced
        steps += 1
    return tokens / steps if steps else 0.0


def first_divergence(trace: list[int], generated: list[int]) -> int:
    """The first position where ``generated`` leaves ``trace`` (its length when it never does)."""
    for i, tok in enumerate(trace):
        if i >= len(generated) or generated[i] != tok:
            return i
    return len(trace)


@register("long_chain")
class LongChainSuite(LongChainDeclaration, SuiteKind):
    """KL and agreement by depth on the source's greedy traces, divergence, draft acceptance."""

    spec_model = LongChainSpec

    def cost(self, profile: str) -> float:
        """Each trace teacher-forced once and generated free-running to its length."""
        sizes = self.spec.sizes(profile)
        return float(sizes.traces * sizes.trace_tokens) * (1.0 + DECODE)

    spec: LongChainSpec

    def _prompts(self, ctx: EvalContext, tokenizer) -> tuple[list[list[int]], dict[str, Any]]:
        """The prompts of ``traces`` problems drawn at random, without replacement, from the data past
        ``offset`` (a seeded draw: each trace is its own problem, so traces are independent draws
        from that population), and the draw's design for the gate (``results.SampleDesign``)."""
        from quantgate.evaluate.generation import chat_prompt

        sizes = self.spec.sizes(ctx.profile)
        pool = load_jsonl_records(ctx.data, self.spec.data)[self.spec.offset :]
        seed = f"{self.spec.seed}|{self.spec.name}"
        rng = np.random.default_rng(
            int.from_bytes(hashlib.sha256(f"traces|{seed}".encode()).digest()[:8], "big")
        )
        picked = rng.choice(len(pool), size=min(sizes.traces, len(pool)), replace=False)
        prompts = [
            chat_prompt(tokenizer, self.spec.prompt.format(question=pool[int(i)]["question"])) for i in picked
        ]
        width = sizes.trace_tokens / sizes.bins
        deepest = sum(
            1 for j in range(sizes.trace_tokens) if min(int(j / width), sizes.bins - 1) == sizes.bins - 1
        )
        design = {
            "unit": "traces",
            "population": max(len(pool), 1),
            "seed": seed,
            "weights": {"trace_tokens": float(sizes.trace_tokens), "depth_tokens": float(deepest)},
        }
        return prompts, design

    def reference(self, ctx: EvalContext, source) -> tuple[dict, SuiteResult]:
        """The source's greedy traces and its top-k distributions along them, and its result."""
        from quantgate.evaluate.generation import greedy_with_progress
        from quantgate.evaluate.scoring import build_reference

        sizes = self.spec.sizes(ctx.profile)
        prompts, design = self._prompts(ctx, source.tokenizer)
        traces = greedy_with_progress(
            ctx.progress,
            f"{self.spec.name}: source traces",
            source.model,
            source.tokenizer,
            prompts,
            max_new_tokens=sizes.trace_tokens,
            batch_size=sizes.batch_size,
        )
        seqs = [p + t for p, t in zip(prompts, traces, strict=True)]
        ref = build_reference(
            source.model,
            seqs,
            k=self.spec.top_k,
            batch_size=sizes.batch_size,
            pad_id=source.tokenizer.pad_token_id or 0,
        )
        state = {"prompts": prompts, "traces": traces, "reference": ref.to_state(), "sampling": design}
        return state, self._result(ctx, source, state, free_running=traces, scores=ref.own_scores())

    def score(self, ctx: EvalContext, model, reference: dict) -> SuiteResult:
        """Run ``model`` free from the same prompts, then teacher-force it on the source's traces."""
        from quantgate.evaluate.generation import greedy_with_progress

        sizes = self.spec.sizes(ctx.profile)
        generated = greedy_with_progress(
            ctx.progress,
            f"{self.spec.name}: free-running",
            model.model,
            model.tokenizer,
            reference["prompts"],
            max_new_tokens=sizes.trace_tokens,
            batch_size=sizes.batch_size,
            until_leaving=reference["traces"],  # only first_divergence reads the free run
        )
        return self._result(ctx, model, reference, free_running=generated)

    def _result(
        self,
        ctx: EvalContext,
        model,
        reference: dict,
        free_running: list[list[int]],
        scores: list[Scores] | None = None,
    ) -> SuiteResult:
        """``model`` teacher-forced on the source's traces (``scores``: already known, the
        source's own) and its free-running traces compared with them."""
        import torch

        sizes = self.spec.sizes(ctx.profile)
        prompts, traces = reference["prompts"], reference["traces"]
        if scores is None:
            scores = _teacher_forced(model, reference, sizes.batch_size)
        width = sizes.trace_tokens / sizes.bins
        kld_bins: list[list[float]] = [[] for _ in range(sizes.bins)]
        agree_bins: list[list[float]] = [[] for _ in range(sizes.bins)]
        samples, all_kld, all_agree, trace_bins = [], [], [], []
        for i, (prompt, trace, s) in enumerate(zip(prompts, traces, scores, strict=True)):
            # position p of the scores predicts token p+1; trace token j sits at len(prompt)+j
            kld = s.kld[len(prompt) - 1 :]
            agree = s.agree[len(prompt) - 1 :]
            mine: list[list[float]] = [[] for _ in range(sizes.bins)]
            for j in range(len(trace)):
                b = min(int(j / width), sizes.bins - 1)
                kld_bins[b].append(float(kld[j]))
                agree_bins[b].append(float(agree[j]))
                mine[b].append(float(agree[j]))
            trace_bins.append(mine)
            all_kld.append(kld)
            all_agree.append(agree)
            samples.append(
                {
                    "item": i,
                    "trace_tokens": len(trace),
                    "kld_mean": float(kld.mean()) if len(trace) else 0.0,
                    "top1_agreement": float(agree.float().mean()) if len(trace) else 1.0,
                    "first_divergence": first_divergence(trace, free_running[i]),
                    **{
                        f"accepted_per_step_k{k}": accepted_per_step(agree.tolist(), k)
                        for k in self.spec.draft_k
                    },
                }
            )
        deepest = max((b for b in range(sizes.bins) if agree_bins[b]), default=None)
        for sample, mine in zip(samples, trace_bins, strict=True):
            there = mine[deepest] if deepest is not None else []
            sample["depth_tokens"] = len(there)
            sample["depth_agreement"] = sum(there) / len(there) if there else 0.0
        kld_all, agree_all = torch.cat(all_kld), torch.cat(all_agree).float()
        metrics: dict[str, float | None] = {
            "kld_mean": float(kld_all.mean()),
            "top1_agreement": float(agree_all.mean()),
            "first_divergence_mean": sum(s["first_divergence"] for s in samples) / len(samples),
            "first_divergence_fraction": sum(
                s["first_divergence"] / max(1, s["trace_tokens"]) for s in samples
            )
            / len(samples),
        }
        for b in range(sizes.bins):
            metrics[f"kld_bin{b + 1}"] = sum(kld_bins[b]) / len(kld_bins[b]) if kld_bins[b] else None
            metrics[f"agreement_bin{b + 1}"] = (
                sum(agree_bins[b]) / len(agree_bins[b]) if agree_bins[b] else None
            )
        metrics["agreement_at_depth"] = next(
            (
                metrics[f"agreement_bin{b}"]
                for b in range(sizes.bins, 0, -1)
                if metrics[f"agreement_bin{b}"] is not None
            ),
            None,
        )
        for k in self.spec.draft_k:
            metrics[f"acceptance_k{k}"] = accepted_per_step(agree_all.bool().tolist(), k)
        notes = [f"bins of {width:.0f} trace tokens; bin {sizes.bins} is the deepest"]
        return SuiteResult(
            self.spec.name, "long_chain", metrics, samples, notes, sampling=reference.get("sampling")
        )


def _teacher_forced(model, reference: dict, batch_size: int) -> list[Scores]:
    """``model`` scored on the source's traces (prompt and trace), against the source's reference."""
    from quantgate.evaluate.scoring import Reference, score

    seqs = [p + t for p, t in zip(reference["prompts"], reference["traces"], strict=True)]
    ref = Reference.from_state(reference["reference"])
    return score(model.model, seqs, ref, batch_size=batch_size, pad_id=model.tokenizer.pad_token_id or 0)
