"""Signed release records: which version a tenant is served, as of a sequence number, until an expiry.

Why: the gate's signed approval (``approval``) is valid until replaced, and an alias is a
pointer anyone who can write the registry can move. Once a tenant's approval was withdrawn,
putting back the older signed approval and its alias made pull install the withdrawn version
again (RELIABILITY.md 7.1, issue 44): a signature says who wrote a statement, not that it is
still the newest. The Update Framework solves the same problem for software repositories with
two roles: *snapshot* (a version number per metadata file that only grows, so a client refuses
any state older than one it has seen: a rollback) and *timestamp* (a short expiry re-signed often,
so a client refuses a stale view that a compromised mirror keeps serving: a freeze). A release
record is both, per (registered model, tenant, channel):

- ``sequence`` grows by one with every record the pipeline signs for that key; a node keeps the
  highest it has verified (``Ledger``, in its pull cache) and refuses a lower one, or another
  record with the same number (TUF: ``ReplayedMetadataError``);
- ``expires_at``: a node refuses a record past it (TUF: ``ExpiredMetadataError``), so a replayed
  record is refused by every node once it expires, even by nodes that never saw the newer one;
  ``release_ttl_hours`` sets it (``registry.yaml``, ``QUANTGATE_RELEASE_TTL_HOURS``), and
  ``quantgate release --renew`` re-signs the current state (a TUF timestamp role's job);
- ``version`` and ``manifest_sha256`` are what is released (None: nothing, after a withdrawal),
  and pull installs only that: the alias must point at it and the signed approval name its
  manifest; ``evidence_sha256`` is the digest of why (the gate report; an operator's reason);
- an operator's rollback is a *new* record with a higher number (``event: rollback``), so it is
  told apart from a replay by the only thing an attacker without the key cannot forge.

``event`` and ``channel`` make the record the one a rollout writes too: ``stable`` is what pull
serves today; a canary's start, promotion, rollback or hold is a record on the ``canary``
channel (or, promoted, on ``stable``) with the canary's evidence digest. Records sit in the
registered model's tags (``quantgate.release.<channel>.<tenant>`` and its ``_sig``), read by the
same call that reads the aliases, and are signed like approvals (model-signing, the publisher's
key, over a file named ``release.json``, so neither can stand for the other).

Why not python-tuf itself: its metadata are repository-wide files (one snapshot version for
every target, so every publish of every model would serialize on one file and one writer), served
over HTTP under fixed names and trusted through a TUF root of its own keys and thresholds, while
quantgate's registry is MLflow tags and its trust is the fleet's ``trusted_keys``. Using it would
mean a second key hierarchy and a metadata server beside the registry; the two rules above are
the part of TUF this problem needs, and they are what this module implements. What it does not
do: MLflow has no compare-and-set, so two publishes at once may both sign number n+1 (nodes
accept both only if they release the same version: ``Ledger``); a node that never verified a
withdrawal accepts a replay of the older record until that record expires.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

from pydantic import AwareDatetime, Field, ValidationError

from quantgate.publish import signing
from quantgate.publish.config import RegistryConfig
from quantgate.runtime.atomic import write_json
from quantgate.runtime.errors import SignatureError, StaleReleaseError
from quantgate.runtime.frozen import FrozenRecord

KIND = "quantgate.release"
FILE = "release.json"  # the record's name while it is signed and verified (never stored)
TAG = "quantgate.release"  # + ".<channel>.<tenant>", on the registered model
SIGNATURE_TAG = "quantgate.release_sig"
LEDGER = "releases.json"  # in the node's pull cache: the highest sequence verified per key
MAX_RECORD_CHARS = 10_000  # a record is about 500 characters
MAX_SEQUENCE = 2**53  # exact in every JSON reader
SHA256 = r"^[0-9a-f]{64}$"

Channel = Literal["stable", "canary"]
# approved/withdrawn: the gate (publish); rollback, renewed: an operator (quantgate release);
# canary-*: a rollout, on the canary channel (promoted: on stable too)
Event = Literal[
    "approved",
    "withdrawn",
    "rollback",
    "renewed",
    "canary-started",
    "canary-promoted",
    "canary-rolled-back",
    "canary-held",
]


class ReleaseRecord(FrozenRecord):
    """What one (registered model, tenant, channel) is served, as of ``sequence``, until ``expires_at``."""

    kind: Literal["quantgate.release"] = "quantgate.release"
    schema_version: Literal[1] = 1
    registered_model: str
    tenant: str
    channel: Channel = "stable"
    sequence: int = Field(ge=1, le=MAX_SEQUENCE)
    event: Event
    version: str | None  # the version released on this channel; None: none (withdrawn)
    manifest_sha256: str | None = Field(pattern=SHA256)  # the manifest that version installs
    evidence_sha256: str = Field(pattern=SHA256)  # why: the gate report, an operator's reason, a canary's
    issued_at: AwareDatetime
    expires_at: AwareDatetime
    # a canary's share of the tenant's traffic (canary channel, while a canary runs); absent from
    # the text when None, so the records written before rollouts are signed and digested as before
    share: float | None = Field(default=None, gt=0.0, lt=1.0)

    def text(self) -> str:
        """The exact text that is signed and stored (canonical JSON)."""
        return self.model_dump_json(exclude={"share"} if self.share is None else None)

    def digest(self) -> str:
        """sha256 of ``text()``: what a node remembers of it."""
        return hashlib.sha256(self.text().encode()).hexdigest()

    def releases(self) -> str:
        """What it releases, in words (for messages)."""
        return f"version {self.version}" if self.version is not None else "no version (withdrawn)"


def tag_names(tenant: str, channel: Channel = "stable") -> tuple[str, str]:
    """The registered-model tags holding the record of ``tenant`` on ``channel`` and its signature."""
    return f"{TAG}.{channel}.{tenant}", f"{SIGNATURE_TAG}.{channel}.{tenant}"


def sign(record: ReleaseRecord, cfg: RegistryConfig) -> dict[str, str]:
    """The registered-model tags that carry ``record`` and its signature (the publisher's key)."""
    text = record.text()
    with tempfile.TemporaryDirectory(prefix="quantgate-release-") as tmp:
        path = Path(tmp) / FILE
        path.write_text(text)
        signature = signing.sign(path, cfg)
    names = tag_names(record.tenant, record.channel)
    return {names[0]: text, names[1]: signature.decode()}


def verified(text: str, signature: str, where: str, cfg: RegistryConfig, keys=None) -> ReleaseRecord:
    """The record in ``text`` once its signature verifies (``keys``: these public keys, else the
    fleet's trusted keys); SignatureError naming ``where`` otherwise."""
    if len(text) > MAX_RECORD_CHARS or len(signature) > signing.MAX_SIGNATURE_BYTES:
        raise SignatureError(
            where,
            f"the release record or its signature is longer than quantgate writes ({len(text):,} and "
            f"{len(signature):,} characters)",
            "re-sign it (quantgate release --renew); the registry was altered",
        )
    with tempfile.TemporaryDirectory(prefix="quantgate-release-") as tmp:
        path = Path(tmp) / FILE
        path.write_text(text)
        signing.verify(path, signature.encode(), cfg, where, keys=keys)
    try:
        return ReleaseRecord.model_validate_json(text)
    except ValidationError:
        raise SignatureError(
            where, "the signed release record is not a quantgate release record", "re-sign it"
        ) from None


def read(
    tags: dict[str, str], tenant: str, where: str, cfg: RegistryConfig, channel: Channel = "stable", keys=None
) -> ReleaseRecord | None:
    """The verified record of ``tenant`` on ``channel`` in a registered model's ``tags``; None when
    there is none; SignatureError when it does not verify."""
    name, sig = tag_names(tenant, channel)
    text, signature = tags.get(name), tags.get(sig)
    if not text and not signature:
        return None
    if not text or not signature:
        raise SignatureError(where, "the release record or its signature is missing", "re-sign it")
    return verified(text, signature, where, cfg, keys=keys)


def own(
    tags: dict[str, str], tenant: str, cfg: RegistryConfig, channel: Channel = "stable"
) -> ReleaseRecord | None:
    """The record of ``tenant`` in ``tags`` if the publisher's own key signed it; else None (what
    the pipeline itself last released, which it alone may withdraw)."""
    with tempfile.TemporaryDirectory(prefix="quantgate-key-") as tmp:
        key = signing.public_key_file(signing.signing_key(cfg), Path(tmp))
        try:
            return read(tags, tenant, "release", cfg, channel, keys=(key,))
        except SignatureError:
            return None


def _last_sequence(tags: dict[str, str], tenant: str, channel: Channel) -> int:
    """The sequence the record there now states, verified or not: numbers only grow, so one signed
    by a key since rotated away (or a number an attacker raised, which no node accepts unsigned)
    is passed, never reused."""
    name, _ = tag_names(tenant, channel)
    text = tags.get(name)
    if not text or len(text) > MAX_RECORD_CHARS:
        return 0
    try:
        stated = json.loads(text).get("sequence")
    except (ValueError, AttributeError):
        return 0
    return stated if isinstance(stated, int) and 0 < stated < MAX_SEQUENCE else 0


def next_record(
    tags: dict[str, str],
    cfg: RegistryConfig,
    *,
    registered_model: str,
    tenant: str,
    event: Event,
    version: str | None,
    manifest_sha256: str | None,
    evidence_sha256: str,
    channel: Channel = "stable",
    share: float | None = None,
    now: datetime | None = None,
) -> ReleaseRecord:
    """The record that follows the one in ``tags`` (sequence + 1), issued ``now``, expiring after
    the registry's ``release_ttl_hours``."""
    issued = (now or datetime.now(UTC)).replace(microsecond=0)
    return ReleaseRecord(
        registered_model=registered_model,
        tenant=tenant,
        channel=channel,
        sequence=_last_sequence(tags, tenant, channel) + 1,
        event=event,
        version=None if version is None else str(version),
        manifest_sha256=manifest_sha256,
        evidence_sha256=evidence_sha256,
        issued_at=issued,
        expires_at=issued + timedelta(hours=cfg.release_ttl_hours),
        share=share,
    )


def issue(mlflow_client, cfg: RegistryConfig, name: str, tenant: str, **fields) -> ReleaseRecord:
    """Sign and store the next record of ``tenant`` on ``name`` (``fields``: ``next_record``'s)."""
    tags = dict(mlflow_client.get_registered_model(name).tags or {})
    record = next_record(tags, cfg, registered_model=name, tenant=tenant, **fields)
    for key, value in sign(record, cfg).items():
        mlflow_client.set_registered_model_tag(name, key, value)
    return record


def evidence(text: str) -> str:
    """The evidence digest of ``text`` (an operator's reason)."""
    return hashlib.sha256(text.encode()).hexdigest()


class Ledger:
    """The highest release record a node has verified per (registry, registered model, tenant,
    channel): ``<pull cache>/releases.json``, updated under a lock (pulls on one node run at once)."""

    def __init__(self, root: Path, registry_uri: str) -> None:
        self.path, self.registry_uri = Path(root) / LEDGER, registry_uri

    def key(self, record: ReleaseRecord) -> str:
        """The ledger's key for the state ``record`` is about."""
        return f"{self.registry_uri} {record.registered_model} {record.tenant} {record.channel}"

    def _read(self) -> dict:
        try:
            found = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return found if isinstance(found, dict) else {}

    def admit(self, record: ReleaseRecord, where: str, now: datetime | None = None) -> None:
        """Accept ``record`` as the newest state of its key (and remember it), or refuse it: older
        than the newest verified here, another record under the same number that releases
        something else, or expired."""
        now = now or datetime.now(UTC)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(f".{LEDGER}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            ledger = self._read()
            seen = ledger.get(self.key(record))
            seen = seen if isinstance(seen, dict) else {}
            highest = seen.get("sequence", 0) if isinstance(seen.get("sequence"), int) else 0
            if record.sequence < highest:
                raise StaleReleaseError(
                    where,
                    f"release record {record.sequence} ({record.event}, {record.releases()}) is older than "
                    f"record {highest} ({seen.get('event')}, {_said(seen)}) that this node has verified: "
                    "a replayed approval",
                    "an operator's rollback is a new record (quantgate release --version N); nothing was installed",
                )
            same = (seen.get("version"), seen.get("manifest_sha256")) == (
                record.version,
                record.manifest_sha256,
            )
            if record.sequence == highest and seen.get("sha256") != record.digest() and not same:
                raise StaleReleaseError(
                    where,
                    f"release record {record.sequence} releases {record.releases()}, but the record {highest} "
                    f"this node verified released {_said(seen)}",
                    "re-sign the release (quantgate release --renew); nothing was installed",
                )
            if record.expires_at <= now:
                raise StaleReleaseError(
                    where,
                    f"release record {record.sequence} ({record.releases()}) expired at "
                    f"{record.expires_at.isoformat()}: a registry that stopped changing, or a replay",
                    "re-sign the current release (quantgate release MODEL --target T --tenant X --renew); "
                    "nothing was installed",
                )
            if record.sequence > highest:
                ledger[self.key(record)] = {
                    "sequence": record.sequence,
                    "sha256": record.digest(),
                    "event": record.event,
                    "version": record.version,
                    "manifest_sha256": record.manifest_sha256,
                }
                write_json(self.path, ledger, sort_keys=True)

    def highest(self, record: ReleaseRecord) -> int:
        """The highest sequence verified here for ``record``'s key (0: none)."""
        found = self._read().get(self.key(record))
        return found.get("sequence", 0) if isinstance(found, dict) else 0


def _said(seen: dict) -> str:
    version = seen.get("version")
    return f"version {version}" if version is not None else "no version (withdrawn)"
