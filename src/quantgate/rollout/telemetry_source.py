"""The watcher's built-in evidence source: the fleet's own telemetry, read where operators have it.

``TelemetryEvidence`` satisfies ``watch.EvidenceSource``. At each look it asks the registry which
versions are stable and canary (the tenant's stable alias and the canary's signed record, as the
watcher does), then reads:

- live: both versions' latency histograms and finish-reason counts from Prometheus
  (``evidence.read_live``, metric and label names from the telemetry settings, the model label's
  value ``served_model`` or the published model name), plus the errors and aborts of the request
  logs (``evidence.read_logs`` / ``errors_by_version``: JSONL files in the artifact store, read
  whole at every look, so their counts are cumulative as the Prometheus counters are);
- replay: a replay JSON file (``quantgate replay --json`` writes one; cumulative, like live
  evidence: the decision tests the pairs new since its last look), or none.

Nothing is cached between looks: every look reads the sources again, so a look may run on any
worker, and a look killed half way leaves nothing behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from quantgate.publish import (
    RegistryConfig,
    alias_for,
    read_view,
    registered_model_name,
    registry_client,
    registry_errors,
)
from quantgate.rollout.evidence import (
    LiveEvidence,
    ReplayEvidence,
    TelemetrySettings,
    errors_by_version,
    read_live,
    read_logs,
)
from quantgate.rollout.evidence_files import load_replay
from quantgate.runtime.errors import InputError


def split_log_uri(uri: str) -> tuple[str, str]:
    """A request log's URI as (the store's base URI, the log's name under it)."""
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        base, _, name = uri.rstrip("/").rpartition("/")
        if not name or base in ("s3:/", "s3:"):
            raise InputError(uri, "names no request log", "pass s3://bucket/prefix/requests.jsonl")
        return base, name
    if parsed.scheme not in ("", "file"):
        raise InputError(uri, f"'{parsed.scheme}://' logs are not read", "pass a local path or s3://")
    path = Path(parsed.path if parsed.scheme == "file" else uri).resolve()
    return str(path.parent), path.name


def store_at(base: str, cfg: RegistryConfig):
    """The store under ``base`` (a local directory or ``s3://``), with the registry's S3 settings."""
    from quantgate.publish import LocalStore, S3Store

    return S3Store(base, cfg) if base.startswith("s3://") else LocalStore(base)


@dataclass(frozen=True)
class TelemetryEvidence:
    """An ``EvidenceSource`` over Prometheus, request logs in the store, and a replay file."""

    cfg: RegistryConfig
    settings: TelemetrySettings
    logs: tuple[str, ...] = ()  # request logs' URIs (local paths or s3://)
    replay: Path | None = None
    served_model: str | None = None  # the model label's value, where it is not the published name
    window_s: int | None = None  # read increase(...[window]) instead of raw counters

    def versions(self, model: str, target: str, tenant: str) -> tuple[str, str]:
        """(stable, canary) versions now: the stable alias and the canary's record."""
        name = registered_model_name(model, target)
        with registry_errors(self.cfg):
            view = read_view(registry_client(self.cfg), self.cfg, name, tenant)
        stable = view.aliases.get(alias_for(tenant))
        canary = view.canary.version if view.canary is not None else None
        if stable is None or canary is None:
            raise InputError(
                name,
                f"tenant '{tenant}' has no {'stable version' if stable is None else 'canary'} to compare",
                "start a canary by publishing a version the gate passes for a tenant with a stable one",
            )
        return stable, canary

    def log_errors(self) -> dict[str, int]:
        """Errors and aborts per version over every request log."""
        records = []
        for uri in self.logs:
            base, name = split_log_uri(uri)
            records.extend(read_logs(store_at(base, self.cfg), [name]))
        return errors_by_version(records)

    def read_live(self, model: str, target: str, tenant: str) -> LiveEvidence:
        """Both versions' telemetry from Prometheus, the request logs' errors added."""
        stable, canary = self.versions(model, target, tenant)
        return read_live(
            self.settings,
            self.served_model or model,
            stable,
            canary,
            log_errors=self.log_errors(),
            window_s=self.window_s,
        )

    def read_replay(self, model: str, target: str, tenant: str) -> ReplayEvidence | None:
        """The replay file, if given."""
        return None if self.replay is None else load_replay(self.replay)
