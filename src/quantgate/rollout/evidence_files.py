"""Evidence as JSON files: what ``quantgate rollout watch --live F --replay F`` reads, an
``EvidenceSource`` for evidence gathered elsewhere (an export, a test's simulated telemetry).

The files are the evidence types' fields as JSON (``dataclasses.asdict``); ``+inf`` bucket bounds
are written as the string "+Inf", as Prometheus writes them. A malformed file is an InputError
naming it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from quantgate.rollout.evidence import (
    LatencyHistogram,
    LiveEvidence,
    ReplayEvidence,
    ReplayPair,
    VersionTelemetry,
)
from quantgate.runtime.errors import InputError


def _bound(b) -> float:
    return float("inf") if b in ("+Inf", "inf", "Infinity") else float(b)


def live_to_json(live: LiveEvidence) -> str:
    """The file's text."""
    data = asdict(live)
    for side in ("stable", "canary"):
        for h in data[side]["latency"]:
            h["upper_bounds"] = ["+Inf" if b == float("inf") else b for b in h["upper_bounds"]]
    return json.dumps(data)


def replay_to_json(replay: ReplayEvidence) -> str:
    """The file's text."""
    return json.dumps(asdict(replay))


def _telemetry(d: dict) -> VersionTelemetry:
    hists = tuple(
        LatencyHistogram(
            h["metric"],
            tuple(_bound(b) for b in h["upper_bounds"]),
            tuple(int(c) for c in h["cumulative_counts"]),
        )
        for h in d["latency"]
    )
    return VersionTelemetry(str(d["version"]), hists, int(d["requests"]), int(d["errors"]))


def load_live(path: Path) -> LiveEvidence:
    """Live evidence from ``path``."""
    try:
        d = json.loads(Path(path).read_text())
        return LiveEvidence(
            _telemetry(d["stable"]), _telemetry(d["canary"]), str(d["read_at"]), str(d["digest"])
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(
            path, f"is not live rollout evidence ({exc})", "write it as LiveEvidence JSON"
        ) from None


def load_replay(path: Path) -> ReplayEvidence:
    """Replay evidence from ``path``."""
    try:
        d = json.loads(Path(path).read_text())
        pairs = tuple(ReplayPair(**p) for p in d["pairs"])
        return ReplayEvidence(
            str(d["stable_endpoint"]), str(d["canary_endpoint"]), int(d["seed"]), pairs, str(d["digest"])
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(path, f"is not replay evidence ({exc})", "write it as ReplayEvidence JSON") from None


@dataclass(frozen=True)
class FileEvidence:
    """An ``EvidenceSource`` reading the same files at every look."""

    live: Path
    replay: Path | None = None

    def read_live(self, model: str, target: str, tenant: str) -> LiveEvidence:
        """The live file."""
        return load_live(self.live)

    def read_replay(self, model: str, target: str, tenant: str) -> ReplayEvidence | None:
        """The replay file, if given."""
        return None if self.replay is None else load_replay(self.replay)
