"""What ``pull`` checks of a tenant's signed release record (``release``) before it follows an alias.

Online, as soon as the registered model is read (the same call that reads the aliases, before
the alias is looked at, so that even a refused pull teaches the node a withdrawal): the record
must be there, verify under the fleet's trusted keys, be about the model and tenant asked, be
no older than the newest this node has verified and not expired (``release.Ledger``, which then
remembers it), release a version (not a withdrawal), and that version must be the one the alias
points at; after resolving, the signed approval must name the manifest the record releases.
``--offline`` checks the record remembered with the resolution the same way, against the same
ledger: a node that has since verified a newer record (a withdrawal, a rollback) refuses the
older resolution. ``--allow-unapproved`` (a non-serving test) checks none of it, as it skips the
tenant's approval.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from quantgate.publish import naming, release
from quantgate.publish.approval import Approval
from quantgate.publish.config import RegistryConfig
from quantgate.publish.release import Ledger, ReleaseRecord
from quantgate.runtime.errors import StaleReleaseError, TamperedArtifactError, UnapprovedVersionError

RECORD, SIGNATURE = "release", "release_sig"  # the keys of a remembered resolution (--offline)


@dataclass
class ReleaseCheck:
    """The release checks of one pull of ``name`` for ``tenant`` (callable as resolve's hook)."""

    name: str  # the registered model
    tenant: str
    cfg: RegistryConfig
    cache_root: Path
    channel: release.Channel = "stable"  # canary: the canary channel's record and alias (rollout)
    record: ReleaseRecord | None = None
    remembered: dict[str, str] = field(default_factory=dict)  # the record's text and signature

    @property
    def ledger(self) -> Ledger:
        """The node's highest verified records."""
        return Ledger(self.cache_root, self.cfg.model_registry_uri)

    def __call__(self, model) -> None:
        """The registered model as the registry returned it: its record checked and admitted, and
        its alias for the tenant compared with what the record releases."""
        tags = dict(model.tags or {})
        tag, sig = release.tag_names(self.tenant, self.channel)
        where = f"{self.name} (tag {tag})"
        record = release.read(tags, self.tenant, where, self.cfg, self.channel)
        alias_name = naming.channel_alias(self.tenant, self.channel)
        alias = (model.aliases or {}).get(alias_name)
        if record is None and alias is None:
            return  # never released to this tenant: resolve refuses it, naming the alias
        if record is None:
            raise UnapprovedVersionError(
                where,
                f"no signed release record for tenant '{self.tenant}' (published by an older quantgate, "
                "or the tag was removed)",
                "publish the gate report again (quantgate publish), or re-sign the current release "
                "(quantgate release MODEL --target T --tenant X --renew); nothing was installed",
            )
        self._admit(record, where)
        self.record, self.remembered = record, {RECORD: tags[tag], SIGNATURE: tags[sig]}
        if alias is not None and str(alias) != record.version:
            raise StaleReleaseError(
                where,
                f"alias '{alias_name}' points at version {alias}, but the newest signed "
                f"release record ({record.sequence}, {record.event}) releases {record.releases()}: the alias "
                "was moved without the pipeline, or put back after a withdrawal",
                "move the alias back, or release that version through quantgate release --version N "
                "(a new signed record); nothing was installed",
            )

    def _admit(self, record: ReleaseRecord, where: str) -> None:
        asked = (self.name, self.tenant, self.channel)
        if (record.registered_model, record.tenant, record.channel) != asked:
            raise TamperedArtifactError(
                where,
                f"the signed release record is about '{record.registered_model}' for tenant '{record.tenant}' "
                f"({record.channel}), not '{self.name}' for '{self.tenant}' ({self.channel})",
                "re-sign the release (quantgate release --renew); nothing was installed",
            )
        self.ledger.admit(record, where)
        if record.version is None and self.channel == "canary":
            raise UnapprovedVersionError(
                where,
                f"release record {record.sequence} ({record.event}): no canary of '{self.name}' runs for "
                f"tenant '{self.tenant}'",
                "pull --channel stable; nothing was installed",
            )
        if record.version is None:
            raise UnapprovedVersionError(
                where,
                f"release record {record.sequence} ({record.event}) releases no version of '{self.name}' "
                f"to tenant '{self.tenant}': its approval was withdrawn",
                "wait for a version the gate approves, or an operator's release of an approved one "
                "(quantgate release --version N); nothing was installed",
            )

    def agrees(self, signed: Approval, version: str, where: str) -> None:
        """The resolved ``version`` and its signed approval are what the admitted record releases."""
        record = self.record
        if record is None:
            raise UnapprovedVersionError(
                where,
                f"no signed release record releases version {version} to tenant '{self.tenant}'",
                "publish the gate report again (quantgate publish); nothing was installed",
            )
        if (record.version, record.manifest_sha256) != (version, signed.manifest_sha256):
            raise StaleReleaseError(
                where,
                f"release record {record.sequence} releases {record.releases()} (manifest "
                f"{str(record.manifest_sha256)[:12]}), not version {version} (manifest "
                f"{signed.manifest_sha256[:12]})",
                "pull the released version (omit --version), or release this one (quantgate release "
                "--version N); nothing was installed",
            )

    def offline(self, remembered: dict, version: str, signed: Approval, where: str) -> None:
        """The record remembered with an offline resolution, checked as online, against the ledger."""
        text, signature = remembered.get(RECORD), remembered.get(SIGNATURE)
        if not isinstance(text, str) or not isinstance(signature, str):
            raise UnapprovedVersionError(
                where,
                "the cached resolution has no signed release record (pulled by an older quantgate)",
                "pull online once, then --offline works",
            )
        record = release.verified(text, signature, where, self.cfg)
        self._admit(record, where)
        self.record = record
        self.agrees(signed, version, where)
