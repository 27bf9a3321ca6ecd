"""Text suites: perplexity, KL divergence to the source, and top-1 agreement on a corpus.

The corpus is either a public file (WikiText-2) or the calibration domain: prompts from the
traffic log that the calibration set did *not* sample, so the artifact is measured on the
traffic it will serve without being scored on its own calibration data.

Windows are drawn at random from the whole corpus (``draw_windows``): the text is tokenized once
and cut, from a seeded random offset, into the ``population`` of non-overlapping slots of
``seq_len`` tokens; ``tokens // seq_len`` of them are drawn without replacement by a seeded
generator, in the order drawn (each window's ``item`` is its draw number, ``position`` its first
token). Why: consecutive cuts from the start of the corpus are neighbours, whose values correlate
(0.16-0.49 between wikitext neighbours, measured), and the same few pages every time; a random
draw makes the windows exchangeable draws from the corpus, which is what the gate's test assumes
(``quantgate.stats``), and the population and seed go into the result (``SampleDesign``).

Each window is one item for paired statistics. Its first ``context`` positions are fed but not
scored: each scored token sees at least that much text, while the windows stay short and many
(the gate's evidence grows with the number of windows, not their length). The gate measures
perplexity, mean KL divergence and top-1 agreement per window (token-weighted), and the 99th KL
percentile pooled over windows: each window keeps its largest per-token KL values (``kld_top``,
4 significant digits), as many as the pooled p99 over every window can need.
"""

from __future__ import annotations

import hashlib
import math
import random
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from quantgate.config import file_digest
from quantgate.declarations.metrics import (
    tail_size,
)
from quantgate.declarations.suite_kinds.text import KLD_Q, TextDeclaration, TextSizes, TextSpec
from quantgate.evaluate.data import load_text
from quantgate.evaluate.suites.kind import EvalContext, SuiteKind, SuiteResult, register
from quantgate.runtime.errors import ConfigFileError
from quantgate.runtime.frozen import Frozen

if TYPE_CHECKING:
    from quantgate.evaluate.scoring import Scores


def corpus(spec: TextSpec, ctx: EvalContext, path: Path) -> str:
    """The suite's text: the data file, or the held-out traffic prompts in a seeded order."""
    if spec.data is not None:
        return load_text(ctx.data, spec.data)
    if spec.traffic is None:
        raise ConfigFileError(path, "no corpus: neither 'data' nor 'traffic' is given", "add one of them")
    from quantgate.calibration import build_set, load_spec, read_traffic_log

    calib_spec = load_spec((path.parent / spec.traffic.calibration_spec).resolve())
    used = {r.id for r in build_set(calib_spec).records}
    held_out = [r["text"] for r in read_traffic_log(calib_spec.traffic_log) if r["id"] not in used]
    random.Random(spec.seed).shuffle(held_out)
    return "\n\n".join(held_out)


class Drawn(Frozen):
    """Windows drawn from a corpus: their tokens, first positions, and the slots they came from."""

    windows: list[list[int]]
    positions: list[int]
    population: int
    seed: str


def draw_windows(tokenizer, text: str, sizes: TextSizes, seed: str = "0") -> Drawn:
    """``tokens // seq_len`` windows drawn at random, without replacement, from the corpus's
    non-overlapping slots of ``seq_len`` tokens cut from a random offset (module docstring); all
    of them, in a random order, when the corpus holds fewer."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    rng = np.random.default_rng(
        int.from_bytes(hashlib.sha256(f"windows|{seed}".encode()).digest()[:8], "big")
    )
    offset = int(rng.integers(sizes.seq_len)) if len(ids) >= 2 * sizes.seq_len else 0
    population = (len(ids) - offset) // sizes.seq_len
    n = min(sizes.tokens // sizes.seq_len, population)
    slots = [int(i) for i in rng.choice(population, size=n, replace=False)] if n else []
    positions = [offset + i * sizes.seq_len for i in slots]
    return Drawn(
        windows=[ids[p : p + sizes.seq_len] for p in positions],
        positions=positions,
        population=max(population, 1),
        seed=seed,
    )


def windows(tokenizer, text: str, sizes: TextSizes, seed: str = "0") -> list[list[int]]:
    """The windows ``draw_windows`` draws (benchmarks score them as the suite does)."""
    return draw_windows(tokenizer, text, sizes, seed).windows


def summarize(
    name: str,
    scores,
    samples_extra=None,
    *,
    items: list[int] | None = None,
    tail_items: int | None = None,
    context: int = 0,
    positions: list[int] | None = None,
) -> tuple[dict[str, float | None], list[dict]]:
    """The suite's metrics over all windows, and one per-item record per window.

    ``items``: the windows' ids when they are a subset (sequential evaluation), else their draw
    order; ``tail_items``: how many windows the suite has in all, so that each keeps as many of its
    largest KL values as a pooled p99 over all of them can need; ``context``: leading positions of
    each window that are not scored; ``positions``: each window's first token in the corpus.
    """
    import torch

    from quantgate.evaluate.scoring import Scores

    scores = [Scores(nll=s.nll[context:], kld=s.kld[context:], agree=s.agree[context:]) for s in scores]

    nll = torch.cat([s.nll for s in scores])
    kld = torch.cat([s.kld for s in scores])
    agree = torch.cat([s.agree for s in scores]).float()
    metrics: dict[str, float | None] = {
        "perplexity": math.exp(float(nll.mean())),
        "kld_mean": float(kld.mean()),
        "kld_p99": float(torch.quantile(kld.double(), KLD_Q)),
        "top1_agreement": float(agree.mean()),
        "tokens": float(len(nll)),
    }
    keep = tail_size(KLD_Q, tail_items or len(scores), max((len(s.kld) for s in scores), default=0))
    ids = items if items is not None else list(range(len(scores)))
    samples = [
        {
            "item": ids[i],
            **({"position": positions[i]} if positions is not None else {}),
            "tokens": len(s.nll),
            "nll_sum": float(s.nll.sum()),
            "kld_mean": float(s.kld.mean()),
            "kld_p99": float(torch.quantile(s.kld.double(), KLD_Q)),
            "top1_agreement": float(s.agree.float().mean()),
            "kld_top": [float(f"{v:.4g}") for v in torch.sort(s.kld, descending=True).values[:keep].tolist()],
        }
        for i, s in enumerate(scores)
    ]
    return metrics, samples


@register("text")
class TextSuite(TextDeclaration, SuiteKind):
    """Perplexity, KL divergence and top-1 agreement against the source, window by window."""

    spec_model = TextSpec

    def cost(self, profile: str) -> float:
        """Teacher-forced windows: the tokens scored."""
        return float(self.spec.sizes(profile).tokens)

    def inputs(self) -> list[str]:
        """The traffic corpus: the calibration spec's content and its log's bytes (the set it
        holds out depends on both). A pinned data file is already in the spec (its sha256)."""
        if self.spec.traffic is None:
            return []
        from quantgate.calibration import cache_key, load_spec

        where = (self.path.parent / self.spec.traffic.calibration_spec).resolve()
        try:
            calib = load_spec(where)
            return [cache_key(calib, Path(calib.traffic_log).read_bytes())]
        except (ConfigFileError, OSError):  # the evaluation reports it, naming the file
            return [file_digest(where)]

    spec: TextSpec

    def _draw(self, ctx: EvalContext, tokenizer) -> Drawn:
        seed = f"{self.spec.seed}|{self.spec.name}"
        return draw_windows(tokenizer, corpus(self.spec, ctx, self.path), self.spec.sizes(ctx.profile), seed)

    def reference(self, ctx: EvalContext, source) -> tuple[dict, SuiteResult]:
        """The windows and the source's top-k distributions over them, and its own scores."""
        from quantgate.evaluate.scoring import build_reference

        sizes = self.spec.sizes(ctx.profile)
        drawn = self._draw(ctx, source.tokenizer)
        seqs = drawn.windows
        pad = source.tokenizer.pad_token_id or 0
        with ctx.progress.task(f"{self.spec.name}: source reference", total=len(seqs)) as task:
            ref = build_reference(
                source.model,
                seqs,
                k=self.spec.top_k,
                batch_size=sizes.batch_size,
                pad_id=pad,
                on_batch=task.advance,
            )
        state = {
            "sequences": seqs,
            "reference": ref.to_state(),
            "positions": drawn.positions,
            "sampling": {
                "unit": "windows",
                "population": drawn.population,
                "seed": drawn.seed,
                "weights": {"tokens": float(sizes.scored)},
            },
            "context": sizes.context,
        }
        return state, self._result(state, ref.own_scores())

    def score(self, ctx: EvalContext, model, reference: dict) -> SuiteResult:
        """Teacher-force ``model`` on the reference's windows and score it against the source."""
        from quantgate.evaluate.scoring import Reference, score

        sizes = self.spec.sizes(ctx.profile)
        seqs, ref = reference["sequences"], Reference.from_state(reference["reference"])
        pad = model.tokenizer.pad_token_id or 0
        with ctx.progress.task(f"{self.spec.name}: scoring", total=len(seqs)) as task:
            scores = score(
                model.model, seqs, ref, batch_size=sizes.batch_size, pad_id=pad, on_batch=task.advance
            )
        return self._result(reference, scores)

    def _result(self, reference: dict, scores: list[Scores]) -> SuiteResult:
        """The suite's metrics and per-window records from per-position scores."""
        metrics, samples = summarize(
            self.spec.name,
            scores,
            items=reference.get("items"),
            tail_items=reference.get("tail_items"),
            context=int(reference.get("context", 0)),
            positions=reference.get("positions"),
        )
        return SuiteResult(self.spec.name, "text", metrics, samples, sampling=reference.get("sampling"))

    def subset(self, reference: dict, positions: list[int]) -> dict:
        """The windows at ``positions`` and the source's distributions over them, labelled with
        their own ids, keeping KL tails sized for every window of the suite."""
        ref = reference["reference"]
        first = reference.get("positions")
        return {
            "sequences": [reference["sequences"][i] for i in positions],
            "reference": {k: [v[i] for i in positions] for k, v in ref.items()},
            "items": list(positions),
            "tail_items": len(reference["sequences"]),
            "positions": [first[i] for i in positions] if first is not None else None,
            "sampling": reference.get("sampling"),
            "context": reference.get("context", 0),
        }
