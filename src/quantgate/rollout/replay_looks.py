"""Continuous canary replay: at every look the watcher itself replays a new sample of logged
prompts through the stable and the canary endpoints, and keeps the pairs in the store.

``ReplayingEvidence`` wraps a look's live source (Prometheus, a file, one's own) and answers
``read_replay`` by calling the two endpoints (``replay.replay_prompts``, the code behind
``quantgate replay``). What makes it safe to kill and to re-run:

- the look is known from the registry, not from the worker: the watcher's state tag says how many
  looks this canary (version, start) has had, so this one is that number plus one;
- the sample is seeded by (canary version, start, look) and drawn from the logged prompts not
  replayed at an earlier look, so a re-run after a kill draws the same sample, and each look
  replays prompts the decision has not seen;
- each look's pairs are one JSON file in the store, ``<store>/rollout-replay/<registered model>/
  <tenant>/<canary version>-<start digest>/look-NNNN.json``, written whole once the sample is
  replayed; a look that finds its file reuses it (idempotent), so a decision re-taken after a kill
  tests the same pairs. Only the prompts' sha256 is written, never a prompt.

The decision reads the accumulated pairs of looks 1..N and tests those new since its last look.
An endpoint that does not answer is an ``EvidenceUnavailableError`` (exit 75): the look stops
before anything is decided or written, and the next scheduled look tries again; a watcher never
acts on replay evidence it could not get.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from quantgate.publish import (
    RegistryConfig,
    read_view,
    registered_model_name,
    registry_client,
    registry_errors,
)
from quantgate.rollout.evidence import (
    LiveEvidence,
    ReplayEvidence,
    ReplayPair,
    evidence_digest,
    read_logs,
    sample_prompts,
)
from quantgate.rollout.evidence_files import replay_to_json
from quantgate.rollout.replay import ReplaySettings, replay_prompts
from quantgate.rollout.replay_compare import prompt_sha256
from quantgate.rollout.telemetry_source import split_log_uri, store_at
from quantgate.runtime.errors import InputError

if TYPE_CHECKING:
    from quantgate.rollout.watch import EvidenceSource

PREFIX = "rollout-replay"


@dataclass(frozen=True)
class ReplayLook:
    """Which look of which canary run this is: what names its file and seeds its sample."""

    name: str  # the registered model
    tenant: str
    canary_version: str
    started_at: str  # the canary record's issue time: a re-started canary is a new run
    look: int

    @property
    def seed(self) -> int:
        """The sample's seed: the same for a re-run of this look, new at every look."""
        text = f"{self.name}|{self.tenant}|{self.canary_version}|{self.started_at}|{self.look}"
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")

    def run_dir(self) -> str:
        """The canary run's folder under the store's base URI."""
        start = hashlib.sha256(self.started_at.encode()).hexdigest()[:12]
        return f"{PREFIX}/{self.name}/{self.tenant}/{self.canary_version}-{start}"

    def rel(self, look: int | None = None) -> str:
        """The file of ``look`` (default: this one) in the run's folder."""
        return f"{self.run_dir()}/look-{look or self.look:04d}.json"


def current_look(cfg: RegistryConfig, model: str, target: str, tenant: str) -> ReplayLook:
    """The look the watcher is taking now, from the registry (its state tag and the canary record)."""
    name = registered_model_name(model, target)
    with registry_errors(cfg):
        view = read_view(registry_client(cfg), cfg, name, tenant)
    if view.canary is None or view.canary.version is None:
        raise InputError(name, f"tenant '{tenant}' has no canary to replay", "start a canary first")
    started = view.canary.issued_at.isoformat()
    saved = view.state.get("look_state") or {}
    same_run = (saved.get("canary_version"), saved.get("started_at")) == (view.canary.version, started)
    done = int(saved.get("look", 0)) if same_run else 0
    return ReplayLook(name, tenant, view.canary.version, started, done + 1)


@dataclass(frozen=True)
class ReplayEndpoints:
    """The two endpoints a look replays through, where its prompts come from, and where it keeps
    the pairs: ``prompts`` are request logs' URIs (JSONL, local or ``s3://``; the sample follows
    their own class mix), ``store`` the base URI the look files go under."""

    stable: str
    canary: str
    prompts: tuple[str, ...]
    store: str
    size: int = 16
    settings: ReplaySettings = field(default_factory=ReplaySettings)


def _read_look(store, rel: str) -> tuple[ReplayPair, ...] | None:
    """A stored look's pairs, None when the look has no file; a file whose digest does not match
    its pairs is an InputError naming it (never read as evidence)."""
    size = store.size(rel)
    if size is None:
        return None
    where = f"{store.uri.rstrip('/')}/{rel}"
    with tempfile.TemporaryDirectory(prefix="quantgate-replay-look-") as tmp:
        store.download({rel: size}, Path(tmp), lambda r, p: None, lambda n: None)
        try:
            data = json.loads((Path(tmp) / rel).read_text())
            pairs = tuple(ReplayPair(**p) for p in data["pairs"])
            found = ReplayEvidence(
                str(data["stable_endpoint"]), str(data["canary_endpoint"]), int(data["seed"]), pairs, ""
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(
                where, f"is not a replay look ({exc!r})", "delete it: the look replays again"
            ) from None
    if evidence_digest(found) != data.get("digest"):
        raise InputError(where, "does not match its digest", "delete it: the look replays again")
    return pairs


def _write_look(store, rel: str, evidence: ReplayEvidence) -> None:
    with tempfile.TemporaryDirectory(prefix="quantgate-replay-look-") as tmp:
        path = Path(tmp) / "look.json"
        path.write_text(replay_to_json(evidence))
        store.upload({rel: (path, store.digest(path))}, lambda n: None)


def _sample(endpoints: ReplayEndpoints, cfg: RegistryConfig, seen: set[str], look: ReplayLook) -> list[str]:
    """This look's prompts: logged prompts not replayed before, by the logs' own class mix."""
    records = []
    for uri in endpoints.prompts:
        base, name = split_log_uri(uri)
        records.extend(read_logs(store_at(base, cfg), [name]))
    if not records:
        raise InputError(
            ", ".join(endpoints.prompts), "holds no logged prompts to replay", "point it at request logs"
        )
    fresh = [r for r in records if prompt_sha256(r.prompt) not in seen]
    classes = Counter(r.class_ for r in records)
    mix = {c: n / len(records) for c, n in sorted(classes.items())}
    return [r.prompt for r in sample_prompts(fresh, mix, endpoints.size, look.seed)]


def replay_look(
    cfg: RegistryConfig, endpoints: ReplayEndpoints, look: ReplayLook
) -> tuple[ReplayEvidence, int]:
    """The pairs of looks 1..``look`` (this one's replayed now, or read back if a killed run
    replayed it already), and how many pairs this look added."""
    store = store_at(endpoints.store, cfg)
    earlier: list[ReplayPair] = []
    for k in range(1, look.look):
        earlier.extend(_read_look(store, look.rel(k)) or ())
    pairs = _read_look(store, look.rel())
    if pairs is None:
        prompts = _sample(endpoints, cfg, {p.prompt_sha256 for p in earlier}, look)
        this = replay_prompts(prompts, endpoints.stable, endpoints.canary, look.seed, endpoints.settings)
        _write_look(store, look.rel(), this)
        pairs = this.pairs
    unsigned = ReplayEvidence(endpoints.stable, endpoints.canary, look.seed, (*earlier, *pairs), "")
    return replace(unsigned, digest=evidence_digest(unsigned)), len(pairs)


@dataclass(frozen=True)
class ReplayingEvidence:
    """An ``EvidenceSource``: ``live`` from the wrapped source, replay from the endpoints, each look."""

    live: EvidenceSource
    cfg: RegistryConfig
    endpoints: ReplayEndpoints

    def read_live(self, model: str, target: str, tenant: str) -> LiveEvidence:
        """The wrapped source's live evidence."""
        return self.live.read_live(model, target, tenant)

    def read_replay(self, model: str, target: str, tenant: str) -> ReplayEvidence:
        """This look's new sample replayed (or read back), with every earlier look's pairs."""
        look = current_look(self.cfg, model, target, tenant)
        evidence, _ = replay_look(self.cfg, self.endpoints, look)
        return evidence
