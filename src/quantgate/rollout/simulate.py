"""Simulated telemetry: what the fleet's exporters would report for a latency shape and an error
rate, as cumulative histograms (``evidence`` types). For the calibration bench and the tests,
which build the decision's input from it; nothing here is read by a production look.

Bucket counts are drawn from the shape's exact bucket probabilities (a multinomial), so a look
over a million requests costs what one over a hundred does.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

from quantgate.rollout.evidence import (
    LatencyHistogram,
    LiveEvidence,
    ReplayEvidence,
    ReplayPair,
    VersionTelemetry,
)


def geometric_buckets(low: float, high: float, ratio: float) -> tuple[float, ...]:
    """Bucket bounds low, low*ratio, ... up to high, then +inf (Prometheus ``le``)."""
    n = int(np.ceil(np.log(high / low) / np.log(ratio))) + 1
    return (*[float(low * ratio**i) for i in range(n)], float("inf"))


@dataclass(frozen=True)
class Shape:
    """A latency distribution: ``lognormal`` (sigma) or ``pareto`` (tail index), median ``scale`` s."""

    kind: str
    param: float
    scale: float = 0.2

    def dist(self, slower: float = 1.0):
        """The frozen scipy distribution, every latency times ``slower``."""
        if self.kind == "lognormal":
            return stats.lognorm(self.param, scale=self.scale * slower)
        if self.kind == "pareto":  # a Lomax (Pareto II) shifted to start at 0, median ``scale``
            median = 2 ** (1 / self.param) - 1
            return stats.lomax(self.param, scale=self.scale * slower / median)
        raise ValueError(f"unknown shape {self.kind}")

    def p99(self, slower: float = 1.0) -> float:
        """The true p99."""
        return float(self.dist(slower).ppf(0.99))


def histogram(
    rng, shape: Shape, bounds: tuple[float, ...], n: int, metric: str, slower: float = 1.0
) -> LatencyHistogram:
    """``n`` requests' latencies as a cumulative histogram."""
    cdf = shape.dist(slower).cdf(np.asarray(bounds[:-1]))
    probs = np.diff(np.concatenate([[0.0], cdf, [1.0]]))
    counts = rng.multinomial(n, np.clip(probs, 0, None) / np.clip(probs, 0, None).sum())
    return LatencyHistogram(metric, bounds, tuple(int(x) for x in np.cumsum(counts)))


def add(a: LatencyHistogram, b: LatencyHistogram) -> LatencyHistogram:
    """Two histograms of the same buckets summed (cumulative evidence)."""
    return LatencyHistogram(
        a.metric,
        a.upper_bounds,
        tuple(x + y for x, y in zip(a.cumulative_counts, b.cumulative_counts, strict=True)),
    )


def telemetry(
    rng,
    version: str,
    n: int,
    shape: Shape,
    bounds: tuple[float, ...],
    error_rate: float,
    slower: float = 1.0,
    metrics: tuple[str, ...] = ("ttft", "itl"),
) -> VersionTelemetry:
    """One version's new requests: a histogram per metric (ITL at a tenth of TTFT) and errors."""
    hists = tuple(
        histogram(
            rng,
            Shape(shape.kind, shape.param, shape.scale * (0.1 if m == "itl" else 1.0)),
            bounds,
            n,
            m,
            slower,
        )
        for m in metrics
    )
    return VersionTelemetry(version, hists, n, int(rng.binomial(n, error_rate)))


def accumulate(before: VersionTelemetry | None, new: VersionTelemetry) -> VersionTelemetry:
    """Cumulative telemetry: ``before`` plus ``new``."""
    if before is None:
        return new
    hists = tuple(add(a, b) for a, b in zip(before.latency, new.latency, strict=True))
    return VersionTelemetry(new.version, hists, before.requests + new.requests, before.errors + new.errors)


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def live(stable: VersionTelemetry, canary: VersionTelemetry, read_at: str) -> LiveEvidence:
    """Live evidence with its digest over the rest (as the readers compute it)."""
    return LiveEvidence(stable, canary, read_at, _digest([asdict(stable), asdict(canary), read_at]))


def replay(rng, n: int, agreement: float, exact: float, kl: float, seed: int = 0) -> ReplayEvidence:
    """``n`` paired replays whose mean top-1 agreement, exact-match rate and KL are as given."""
    pairs = tuple(
        ReplayPair(
            prompt_sha256=hashlib.sha256(f"{seed}-{i}".encode()).hexdigest(),
            top1_agreement=float(np.clip(rng.beta(agreement * 20, (1 - agreement) * 20 + 1e-9), 0, 1)),
            kl=float(rng.exponential(kl)),
            exact_match=bool(rng.random() < exact),
            length_delta=0,
            refusal_stable=False,
            refusal_canary=False,
        )
        for i in range(n)
    )
    return ReplayEvidence("http://stable", "http://canary", seed, pairs, _digest([asdict(p) for p in pairs]))
