"""Live telemetry per version, read from Prometheus's HTTP API over the serving engine's metrics.

Each read is a handful of instant queries (``/api/v1/query``): per latency metric, the bucket
series summed by ``le`` over the version's replicas; per finish reason, the request counter. By
default the raw counters are read (cumulative since each replica started: exact, and what a
sequential decision that tests increments wants); with ``window_s`` the queries take
``increase(...[window])`` instead, which Prometheus extrapolates (rounded here to whole requests).

A query that returns nothing is never read as zero: either the metric does not exist under that
name (the setting is wrong, or the engine does not export it) or no series carries the model and
version labels; the error says which, and which setting to fix.
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import httpx

from quantgate.rollout.evidence.digest import evidence_digest
from quantgate.rollout.evidence.errors import (
    EvidenceFormatError,
    EvidenceUnavailableError,
    MissingSeriesError,
)
from quantgate.rollout.evidence.settings import SERIES_FIX, EngineMetrics, TelemetrySettings
from quantgate.rollout.evidence.types import LatencyHistogram, LiveEvidence, VersionTelemetry

LATENCY_KEYS = ("ttft", "itl", "e2e")


def _label_matchers(metrics: EngineMetrics, model: str, version: str) -> str:
    def quoted(value: str) -> str:
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return f"{metrics.model_label}={quoted(model)},{metrics.version_label}={quoted(version)}"


class PrometheusReader:
    """Reads one engine's metrics from one Prometheus server (``TelemetrySettings``)."""

    def __init__(
        self, settings: TelemetrySettings, client: httpx.Client | None = None, window_s: int | None = None
    ) -> None:
        self.settings = settings
        self.window_s = window_s
        self.metrics = settings.engine_metrics()
        self._client = client or httpx.Client(timeout=settings.timeout_s)

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's vector result; transport failures are retryable, API errors are not."""
        url = f"{self.settings.base_url}/api/v1/query"
        try:
            response = self._client.get(url, params={"query": promql})
        except httpx.HTTPError as exc:
            raise EvidenceUnavailableError(
                url,
                f"Prometheus is unreachable ({type(exc).__name__}: {exc})",
                "check prometheus_url in the telemetry file (or QUANTGATE_PROMETHEUS_URL) and that the server runs",
            ) from None
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or body.get("status") != "success":
            problem = body.get("error") if isinstance(body, dict) else response.text[:200]
            if response.status_code >= 500 and not isinstance(body, dict):
                raise EvidenceUnavailableError(
                    url, f"HTTP {response.status_code}", "retry when Prometheus is healthy"
                )
            raise EvidenceFormatError(
                url,
                f"query {promql!r} was refused: {problem}",
                "check the metric and label names in the telemetry file",
            )
        data = body.get("data", {})
        if data.get("resultType") != "vector":
            raise EvidenceFormatError(url, f"expected a vector for {promql!r}", "query an instant vector")
        return list(data.get("result", []))

    def _selector(self, series: str, model: str, version: str) -> str:
        inner = f"{series}{{{_label_matchers(self.metrics, model, version)}}}"
        return f"increase({inner}[{self.window_s}s])" if self.window_s else inner

    def _vector(self, key: str, series: str, model: str, version: str, template: str) -> list[dict[str, Any]]:
        """``template`` around the version's selector of ``series``; where nothing answers under a
        name with colons, its underscore-escaped form is tried: prometheus_client 0.22 and later
        escape ``:`` to ``_`` in the OpenMetrics exposition that Prometheus before 3.0 asks for,
        so vLLM's ``vllm:...`` names arrive there as ``vllm_...``."""
        names = [series] + ([series.replace(":", "_")] if ":" in series else [])
        for name in names:
            result = self.query(template.format(self._selector(name, model, version)))
            if result:
                return result
        raise self._missing(key, series, model, version)

    def _missing(self, key: str, series: str, model: str, version: str) -> MissingSeriesError:
        """Why a query came back empty: the metric is absent altogether, or only these labels are."""
        names = {series, series.replace(":", "_")}
        exists = any(self.query(f'count({{__name__="{name}"}})') for name in names)
        fix = SERIES_FIX.format(key=key)
        if not exists:
            return MissingSeriesError(
                self.settings.base_url,
                f"Prometheus has no series named '{series}' (setting metrics.{key})",
                fix,
            )
        labels = _label_matchers(self.metrics, model, version)
        return MissingSeriesError(
            self.settings.base_url,
            f"'{series}' has no series with {{{labels}}}",
            f"check the model and version, or metrics.model_label / metrics.version_label "
            f"('{self.metrics.model_label}', '{self.metrics.version_label}')",
        )

    def histogram(self, key: str, model: str, version: str) -> LatencyHistogram:
        """One latency histogram of one version, its buckets summed over the version's replicas."""
        series = f"{getattr(self.metrics, key)}_bucket"
        result = self._vector(key, series, model, version, "sum by (le) ({})")
        buckets: list[tuple[float, int]] = []
        for sample in result:
            le = sample.get("metric", {}).get("le")
            if le is None:
                raise EvidenceFormatError(
                    self.settings.base_url,
                    f"'{series}' has a series without 'le'",
                    "scrape classic histograms",
                )
            buckets.append((float(le), round(float(sample["value"][1]))))
        buckets.sort()
        bounds = tuple(b for b, _ in buckets)
        counts = tuple(c for _, c in buckets)
        if not math.isinf(bounds[-1]):
            raise EvidenceFormatError(
                self.settings.base_url, f"'{series}' has no le=\"+Inf\" bucket", "scrape every bucket"
            )
        # counters of replicas scraped at slightly different moments, or an extrapolated increase,
        # may dip by a request between buckets: a cumulative histogram never decreases
        monotone = tuple(max(counts[: i + 1]) for i in range(len(counts)))
        return LatencyHistogram(metric=key, upper_bounds=bounds, cumulative_counts=monotone)

    def finish_reasons(self, model: str, version: str) -> dict[str, int]:
        """Finished requests of one version by finish reason."""
        reason = self.metrics.finish_reason_label
        result = self._vector("requests", self.metrics.requests, model, version, f"sum by ({reason}) ({{}})")
        return {s.get("metric", {}).get(reason, ""): round(float(s["value"][1])) for s in result}

    def version(self, model: str, version: str, extra_errors: int = 0) -> VersionTelemetry:
        """One version's telemetry; ``extra_errors`` adds the request logs' errors."""
        latency = tuple(self.histogram(key, model, version) for key in LATENCY_KEYS)
        reasons = self.finish_reasons(model, version)
        errors = sum(n for r, n in reasons.items() if r in self.metrics.error_reasons)
        return VersionTelemetry(
            version=version, latency=latency, requests=sum(reasons.values()), errors=errors + extra_errors
        )


def read_live(
    settings: TelemetrySettings,
    model: str,
    stable: str,
    canary: str,
    *,
    log_errors: dict[str, int] | None = None,
    window_s: int | None = None,
    client: httpx.Client | None = None,
) -> LiveEvidence:
    """Stable and canary telemetry read now, with its digest; ``log_errors`` (version -> errors
    from the request logs) is added to each version's error count."""
    reader = PrometheusReader(settings, client, window_s)
    log_errors = log_errors or {}
    unsigned = LiveEvidence(
        stable=reader.version(model, stable, log_errors.get(stable, 0)),
        canary=reader.version(model, canary, log_errors.get(canary, 0)),
        read_at=datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        digest="",
    )
    return replace(unsigned, digest=evidence_digest(unsigned))
