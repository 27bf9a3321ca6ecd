"""What a canary decision reads: live telemetry per version and paired replay results.

Evidence is cumulative since the canary started; the decision keeps the previous look's totals
and tests the increments, so a look may come at any time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LatencyHistogram:
    """One latency metric of one version, Prometheus `le` semantics: cumulative bucket counts."""

    metric: str  # "ttft" | "itl" | "e2e"
    upper_bounds: tuple[float, ...]  # seconds, ascending, the last is float("inf")
    cumulative_counts: tuple[int, ...]  # same length; the last equals the number observed


@dataclass(frozen=True)
class VersionTelemetry:
    """One version's live telemetry: its latency histograms, requests and errors."""

    version: str
    latency: tuple[LatencyHistogram, ...]
    requests: int  # finished requests, every finish reason
    errors: int  # finish reason error/abort plus request-log errors


@dataclass(frozen=True)
class LiveEvidence:
    """Both versions' telemetry at one look, with the digest a release record cites."""

    stable: VersionTelemetry
    canary: VersionTelemetry
    read_at: str  # ISO 8601 UTC
    digest: str  # sha256 over the canonical JSON of the rest


@dataclass(frozen=True)
class ReplayPair:
    """One replayed prompt through stable and canary, compared; the prompt only as its hash."""

    prompt_sha256: str  # the prompt itself is never stored
    top1_agreement: float  # share of positions whose top-1 token agrees, 0..1
    kl: float  # mean KL(stable || canary) over the returned top log-probabilities
    exact_match: bool  # greedy outputs identical
    length_delta: int  # canary tokens minus stable tokens
    refusal_stable: bool
    refusal_canary: bool


@dataclass(frozen=True)
class ReplayEvidence:
    """A seeded replay of logged prompts through both endpoints, with its digest."""

    stable_endpoint: str
    canary_endpoint: str
    seed: int
    pairs: tuple[ReplayPair, ...]
    digest: str
