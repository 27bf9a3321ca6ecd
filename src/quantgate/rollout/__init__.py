"""After the gate: a passing version on a share of a tenant's traffic, judged on the fleet's own
telemetry and on replayed prompts, then promoted or rolled back through signed release records.

- ``evidence``: what a look reads (live telemetry per version, paired replays) and its readers;
- ``wealth``, ``latency``, ``decision``: the anytime-valid tests and one look's decision;
- ``watch``: one look of the watcher, resumable after a kill; the state between looks and the
  moves (record first, then aliases) are the registry's, in ``quantgate.publish``'s ``rollout_moves``;
- ``status``: what a router sets its weights from; ``report``: the rollout report;
- ``replay``, ``replay_compare``: logged prompts through the stable and canary endpoints, paired;
  ``replay_looks``: the watcher's own replay, a new seeded sample at each look, kept in the store;
- ``telemetry_source``: the watcher's built-in evidence source (Prometheus, request logs, a replay
  file); ``sources``: which source a look reads, from the CLI's and the flow's named options.
"""

from typing import TYPE_CHECKING

from quantgate.runtime.exports import lazy_exports

if TYPE_CHECKING:
    from quantgate.rollout.decision import Decision, LookState, decide, floor_count
    from quantgate.rollout.evidence import LoggedRequest, as_json, read_logs, sample_prompts
    from quantgate.rollout.evidence_files import FileEvidence, live_to_json, replay_to_json
    from quantgate.rollout.replay import ReplaySettings, replay_prompts, summary
    from quantgate.rollout.replay_looks import ReplayEndpoints, ReplayingEvidence
    from quantgate.rollout.report import write_report
    from quantgate.rollout.sources import SourceOptions, evidence_source
    from quantgate.rollout.status import rollout_status
    from quantgate.rollout.telemetry_source import TelemetryEvidence
    from quantgate.rollout.watch import EvidenceSource, watch_once

__all__ = [
    "Decision",
    "EvidenceSource",
    "FileEvidence",
    "LoggedRequest",
    "LookState",
    "ReplayEndpoints",
    "ReplaySettings",
    "ReplayingEvidence",
    "SourceOptions",
    "TelemetryEvidence",
    "as_json",
    "decide",
    "evidence_source",
    "floor_count",
    "live_to_json",
    "read_logs",
    "replay_prompts",
    "replay_to_json",
    "rollout_status",
    "sample_prompts",
    "summary",
    "watch_once",
    "write_report",
]
__getattr__ = lazy_exports(
    __name__,
    {
        "Decision": "decision",
        "LookState": "decision",
        "decide": "decision",
        "floor_count": "decision",
        "write_report": "report",
        "rollout_status": "status",
        "EvidenceSource": "watch",
        "watch_once": "watch",
        "FileEvidence": "evidence_files",
        "live_to_json": "evidence_files",
        "replay_to_json": "evidence_files",
        "LoggedRequest": "evidence",
        "as_json": "evidence",
        "read_logs": "evidence",
        "sample_prompts": "evidence",
        "ReplaySettings": "replay",
        "replay_prompts": "replay",
        "summary": "replay",
        "ReplayEndpoints": "replay_looks",
        "ReplayingEvidence": "replay_looks",
        "SourceOptions": "sources",
        "evidence_source": "sources",
        "TelemetryEvidence": "telemetry_source",
    },
)
