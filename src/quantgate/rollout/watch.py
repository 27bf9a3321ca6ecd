"""One look of the canary watcher: read the evidence, decide, act; safe to kill at any point.

The order makes a kill harmless. A decision is first written into the watcher's state (one
registry tag: the look number, the action, the evidence digest, the tests' new capitals), then the
signed records are issued, then the aliases moved, then the state marks the move done. A run
that finds a move pending finishes it before it looks again: records already issued are found,
not doubled (``publish.issue_once``), aliases already moved are left. A kill before the state
write loses only that look: the next run reads the same cumulative evidence and tests the same
increments again. Nothing is kept on the worker's disk.

The evidence comes through ``EvidenceSource``: the Prometheus and request-log readers
(``rollout.evidence``) satisfy it, and so does simulated telemetry in tests and benches.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from quantgate.config import RolloutPolicy
from quantgate.publish import (
    RegistryConfig,
    alias_for,
    canary_alias_for,
    issue_once,
    point_alias,
    read_view,
    registered_model_name,
    registry_client,
    registry_errors,
    write_state,
)
from quantgate.rollout.decision import Decision, LookState, decide
from quantgate.rollout.evidence import LiveEvidence, ReplayEvidence

PAUSE_AFTER_RECORD = "QUANTGATE_ROLLOUT_PAUSE_AFTER_RECORD"  # seconds: a test's window to kill -9 in
EVENTS = {"promote": "canary-promoted", "rollback": "canary-rolled-back", "hold": "canary-held"}


class EvidenceSource(Protocol):
    """Where a look reads its evidence (cumulative since the canary started)."""

    def read_live(self, model: str, target: str, tenant: str) -> LiveEvidence:
        """Both versions' live telemetry."""

    def read_replay(self, model: str, target: str, tenant: str) -> ReplayEvidence | None:
        """Paired replays of the canary against stable, None when there are none yet."""


@dataclass(frozen=True)
class WatchOutcome:
    """What one run did: ``idle`` (no canary), ``held`` (waiting for an operator), ``continue``,
    ``promote``, ``rollback``, ``hold``; ``finished``: a move a killed run left pending."""

    action: str
    look: int
    reason: str
    canary_version: str | None
    stable_version: str | None
    finished: bool = False
    decision: Decision | None = None

    def to_dict(self) -> dict:
        """JSON form."""
        return {
            "action": self.action,
            "look": self.look,
            "reason": self.reason,
            "canary_version": self.canary_version,
            "stable_version": self.stable_version,
            "finished_pending": self.finished,
            "decision": None if self.decision is None else self.decision.to_dict(),
        }


def watch_once(
    cfg: RegistryConfig,
    model: str,
    target: str,
    tenant: str,
    policy: RolloutPolicy,
    confidence: float,
    source: EvidenceSource,
    now: datetime | None = None,
) -> WatchOutcome:
    """Finish a pending move, or take one look and act on it (see the module)."""
    name = registered_model_name(model, target)
    client = registry_client(cfg)
    with registry_errors(cfg):
        view = read_view(client, cfg, name, tenant)
        pending = view.state.get("pending")
        if pending:
            _finish(client, cfg, name, tenant, pending, view)
            _mark_done(client, name, tenant, view.state, pending)
            return WatchOutcome(
                pending["action"],
                pending["look"],
                pending["reason"],
                pending["canary_version"],
                pending["stable_version"],
                finished=True,
            )
        canary = view.canary
        stable_version = view.aliases.get(alias_for(tenant))
        if canary is None or canary.version is None:
            return WatchOutcome("idle", 0, "no canary runs", None, stable_version)
        point_alias(client, cfg, name, canary_alias_for(tenant), canary.version)  # a start cut short
        if canary.event == "canary-held":
            look = (view.state.get("outcome") or {}).get("look", 0)
            return WatchOutcome(
                "held",
                look,
                "held at its maximum duration: an operator decides",
                canary.version,
                stable_version,
            )
        saved = view.state.get("look_state")
        state = (
            LookState.from_dict(saved)
            if saved
            and (saved.get("canary_version"), saved.get("started_at"))
            == (canary.version, canary.issued_at.isoformat())
            else LookState(canary.version, str(stable_version), canary.issued_at.isoformat())
        )
        live = source.read_live(model, target, tenant)
        replay = source.read_replay(model, target, tenant)
        decision = decide(policy, confidence, live, replay, state, now or datetime.now(UTC))
        record = {"look_state": state.to_dict(), "last": decision.to_dict()}
        if decision.action == "continue":
            write_state(client, name, tenant, record)
            return WatchOutcome(
                "continue", decision.look, decision.reason, canary.version, stable_version, decision=decision
            )
        pending = {
            "look": decision.look,
            "action": decision.action,
            "reason": decision.reason,
            "evidence_sha256": decision.evidence_sha256,
            "canary_version": canary.version,
            "stable_version": stable_version,
            "manifest_sha256": canary.manifest_sha256,
            "share": canary.share,
        }
        write_state(client, name, tenant, {**record, "pending": pending})  # the decision first
        _finish(client, cfg, name, tenant, pending, view)
        _mark_done(client, name, tenant, record, pending)
    return WatchOutcome(
        decision.action, decision.look, decision.reason, canary.version, stable_version, decision=decision
    )


def _finish(client, cfg: RegistryConfig, name: str, tenant: str, pending: dict, view) -> None:
    """The records of the pending move (each once), then its aliases."""
    action, version, evidence = pending["action"], pending["canary_version"], pending["evidence_sha256"]
    event = EVENTS[action]
    if action == "promote":
        issue_once(
            client,
            cfg,
            name,
            tenant,
            "stable",
            event=event,
            version=version,
            manifest_sha256=pending["manifest_sha256"],
            evidence_sha256=evidence,
        )
    kept = action == "hold"
    issue_once(
        client,
        cfg,
        name,
        tenant,
        "canary",
        event=event,
        version=version if kept else None,
        manifest_sha256=pending["manifest_sha256"] if kept else None,
        evidence_sha256=evidence,
        share=pending["share"] if kept else None,
    )
    pause = float(os.environ.get(PAUSE_AFTER_RECORD) or 0)
    if pause > 0:
        print(f"rollout: look {pending['look']} recorded ({event}); moving aliases", flush=True)
        time.sleep(pause)
    if action == "promote":
        point_alias(client, cfg, name, alias_for(tenant), version)
    if action in ("promote", "rollback"):
        point_alias(client, cfg, name, canary_alias_for(tenant), None)


def _mark_done(client, name: str, tenant: str, state: dict, pending: dict) -> None:
    done = {k: v for k, v in state.items() if k != "pending"}
    write_state(
        client, name, tenant, {**done, "outcome": {k: pending[k] for k in ("look", "action", "reason")}}
    )
