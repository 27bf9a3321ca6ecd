"""Text suites: perplexity, KL divergence to the source, and top-1 agreement on a corpus.

The corpus is either a public file (WikiText-2) or the calibration domain: prompts from the
traffic log that the calibration set did *not* sample, so the artifact is measured on the
traffic it will serve without being scored on its own calibration data. The text is tokenized
once, cut into non-overlapping windows of ``seq_len`` tokens, and each window is one item for
paired statistics. The gate measures perplexity, mean KL divergence and top-1 agreement per
window (token-weighted), and the 99th KL percentile pooled over windows: each window keeps its
largest per-token KL values (``kld_top``, 4 significant digits), as many as the pooled p99 of any
resample of the windows can need, so the gate bootstraps windows and recomputes the quantile.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, PositiveInt

from quantgate.errors import ConfigFileError
from quantgate.evaluate.data import DataSource, load_text
from quantgate.evaluate.suites import EvalContext, SuiteKind, SuiteResult, SuiteSpec, register
from quantgate.frozen import Frozen
from quantgate.metrics import (
    Exceeds,
    Metric,
    Sums,
    perplexity,
    pooled_quantile,
    require_evaluated,
    tail_size,
    weighted_mean,
    weighted_sums,
)

if TYPE_CHECKING:
    from quantgate.evaluate.scoring import Scores

KLD_Q = 0.99  # the quantile kld_p99 reports
# Declared per-window ranges for sequential evaluation (stats/sequence.py), assumptions stated: a
# window's mean KL divergence is at most 1 nat, and its mean per-token NLL moves by at most 1 nat
# against the source (perplexity x2.7), for any artifact that could pass a floor; a window beyond
# them disables early passes for its floor (the fixed design then decides on every window)
KLD_RANGE = (0.0, 1.0)
NLL_CHANGE = (-1.0, 1.0)
NLL_SUMS = Sums(lambda a, s: a["nll_sum"], lambda a, s: a["tokens"], (0.0, 30.0), log=True, diff=NLL_CHANGE)

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
    """One profile's sizes: tokens scored, window length, batch size."""

    tokens: PositiveInt = Field(description="tokens scored (rounded down to whole windows)")
    seq_len: PositiveInt
    batch_size: PositiveInt = 4


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


def windows(tokenizer, text: str, sizes: TextSizes) -> list[list[int]]:
    """Non-overlapping windows of ``seq_len`` tokens, as many as ``tokens`` allows and the text holds."""
    n = sizes.tokens // sizes.seq_len
    # tokenize only as much text as the windows need (about 8 characters a token is generous)
    ids = tokenizer(text[: sizes.tokens * 8], add_special_tokens=False)["input_ids"]
    if len(ids) < n * sizes.seq_len:
        n = len(ids) // sizes.seq_len
    return [ids[i * sizes.seq_len : (i + 1) * sizes.seq_len] for i in range(n)]


def summarize(
    name: str, scores, samples_extra=None, *, items: list[int] | None = None, tail_items: int | None = None
) -> tuple[dict[str, float | None], list[dict]]:
    """The suite's metrics over all windows, and one per-item record per window.

    ``items``: the windows' ids when they are a subset (sequential evaluation), else their
    positions; ``tail_items``: how many windows the suite has in all, so that each keeps as many
    of its largest KL values as a pooled p99 over all of them can need.
    """
    import torch

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
class TextSuite(SuiteKind):
    """Perplexity, KL divergence and top-1 agreement against the source, window by window."""

    spec_model = TextSpec

    def cost(self, profile: str) -> float:
        """Teacher-forced windows: the tokens scored."""
        return float(self.spec.sizes(profile).tokens)

    spec: TextSpec

    def _windows(self, ctx: EvalContext, tokenizer) -> list[list[int]]:
        return windows(tokenizer, corpus(self.spec, ctx, self.path), self.spec.sizes(ctx.profile))

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

    def reference(self, ctx: EvalContext, source) -> tuple[dict, SuiteResult]:
        """The windows and the source's top-k distributions over them, and its own scores."""
        from quantgate.evaluate.scoring import build_reference

        sizes = self.spec.sizes(ctx.profile)
        seqs = self._windows(ctx, source.tokenizer)
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
        state = {"sequences": seqs, "reference": ref.to_state()}
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
            self.spec.name, scores, items=reference.get("items"), tail_items=reference.get("tail_items")
        )
        return SuiteResult(self.spec.name, "text", metrics, samples)

    def subset(self, reference: dict, positions: list[int]) -> dict:
        """The windows at ``positions`` and the source's distributions over them, labelled with
        their own ids, keeping KL tails sized for every window of the suite."""
        ref = reference["reference"]
        return {
            "sequences": [reference["sequences"][i] for i in positions],
            "reference": {k: [v[i] for i in positions] for k, v in ref.items()},
            "items": list(positions),
            "tail_items": len(reference["sequences"]),
        }
