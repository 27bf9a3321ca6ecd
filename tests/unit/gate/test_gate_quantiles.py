"""KL p99 with an interval: each text window keeps only its largest per-token KL values, and that
is enough for the pooled p99 of any resample of windows, exactly as torch.quantile gives it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gate_builders import TEXT

from quantgate.declarations.metrics import pooled_quantile
from quantgate.declarations.suite_kinds.text import KLD_Q
from quantgate.evaluate.scoring import Scores
from quantgate.evaluate.suites.text import summarize

pytestmark = pytest.mark.unit


def _scores(rng: np.random.Generator, windows: int, length: int) -> list[Scores]:
    out = []
    for w in range(windows):
        kld = rng.gamma(0.4, 0.05 * (1 + w % 4), length)
        if w == 0:
            kld[: length // 5] += 30.0  # one window holds far more than 1% of the extremes
        out.append(
            Scores(
                nll=torch.tensor(rng.gamma(2.0, 1.5, length), dtype=torch.float32),
                kld=torch.tensor(kld, dtype=torch.float32),
                agree=torch.tensor(rng.random(length) < 0.9),
            )
        )
    return out


def test_kept_values_give_the_pooled_p99_of_every_resample():
    rng = np.random.default_rng(0)
    scores = _scores(rng, windows=12, length=255)
    metrics, samples = summarize("wikitext", scores)
    # each window keeps as many values as the pooled p99 of any resample of 12 windows can reach
    assert all(len(s["kld_top"]) < 255 for s in samples)
    tails = np.empty(len(samples), dtype=object)
    for i, s in enumerate(samples):
        tails[i] = np.asarray(TEXT.columns(s)["kld_top"])
    counts = np.array([s["tokens"] for s in samples], dtype=float)
    stat = pooled_quantile(KLD_Q, "kld_top", "tokens")
    # on every item, the suite's own p99 (up to the 4 significant digits the records keep)
    assert stat({"kld_top": tails, "tokens": counts}, {}, -1) == pytest.approx(metrics["kld_p99"], rel=1e-3)
    # and on resamples: the same as torch.quantile over the resampled windows' every token
    # (computed on the kept values rounded as the records round them)
    rounded = [torch.tensor([float(f"{v:.4g}") for v in s.kld.tolist()], dtype=torch.float64) for s in scores]
    picks = rng.integers(0, len(samples), (200, len(samples)))
    got = stat({"kld_top": tails[picks], "tokens": counts[picks]}, {}, -1)
    want = [float(torch.quantile(torch.cat([rounded[i] for i in row]), KLD_Q)) for row in picks]
    assert np.allclose(got, want, rtol=0, atol=1e-12)
