"""What a canary decision reads (``types``): live telemetry per version and paired replays."""

from quantgate.rollout.evidence.types import (
    LatencyHistogram,
    LiveEvidence,
    ReplayEvidence,
    ReplayPair,
    VersionTelemetry,
)

__all__ = ["LatencyHistogram", "LiveEvidence", "ReplayEvidence", "ReplayPair", "VersionTelemetry"]
