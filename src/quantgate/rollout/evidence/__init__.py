"""What a canary decision reads: live telemetry (Prometheus over the engine's metrics, request
logs in the artifact store) and paired replay results, as the shared types of ``types``.

``read_live`` reads both versions' latency histograms and finish-reason counts; ``read_logs`` and
``errors_by_version`` add the per-request errors; ``sample_prompts`` draws logged prompts by the
traffic mix for replay (``quantgate.rollout.replay``). Every record carries ``evidence_digest``.
"""

from typing import TYPE_CHECKING

from quantgate.rollout.evidence.errors import (
    EvidenceFormatError,
    EvidenceUnavailableError,
    MissingSeriesError,
)
from quantgate.rollout.evidence.types import (
    LatencyHistogram,
    LiveEvidence,
    ReplayEvidence,
    ReplayPair,
    VersionTelemetry,
)
from quantgate.runtime.exports import lazy_exports

if TYPE_CHECKING:
    from quantgate.rollout.evidence.digest import as_json, evidence_digest
    from quantgate.rollout.evidence.prometheus import PrometheusReader, read_live
    from quantgate.rollout.evidence.request_log import (
        LoggedRequest,
        errors_by_version,
        read_logs,
        sample_prompts,
    )
    from quantgate.rollout.evidence.settings import ENGINES, EngineMetrics, TelemetrySettings, load_telemetry

__all__ = [
    "ENGINES",
    "EngineMetrics",
    "EvidenceFormatError",
    "EvidenceUnavailableError",
    "LatencyHistogram",
    "LiveEvidence",
    "LoggedRequest",
    "MissingSeriesError",
    "PrometheusReader",
    "ReplayEvidence",
    "ReplayPair",
    "TelemetrySettings",
    "VersionTelemetry",
    "as_json",
    "errors_by_version",
    "evidence_digest",
    "load_telemetry",
    "read_live",
    "read_logs",
    "sample_prompts",
]
__getattr__ = lazy_exports(
    __name__,
    {
        "as_json": "digest",
        "evidence_digest": "digest",
        "PrometheusReader": "prometheus",
        "read_live": "prometheus",
        "LoggedRequest": "request_log",
        "errors_by_version": "request_log",
        "read_logs": "request_log",
        "sample_prompts": "request_log",
        "ENGINES": "settings",
        "EngineMetrics": "settings",
        "TelemetrySettings": "settings",
        "load_telemetry": "settings",
    },
)
