"""The gate's approval of one version, signed: what a fleet node checks before it loads anything.

Why a statement of its own: an ``approved-<tenant>`` alias is a pointer that anyone who can write
the registry can move, and the manifest's signature says only "the pipeline built these bytes".
A version the gate failed (registered for audit), another model's artifact registered under
this name, and the hopper-fp8 build registered as rocm-cdna3-fp8 all carry a valid manifest
signature. So publish also signs the gate's decision about the version: one statement naming
the registered model, model, target and version, the gate's verdict per tenant it judged, the
source hash, build key, content hash, manifest sha256 and report sha256, signed with the same
key as the manifest. Pull loads a version only when the statement verifies under a trusted key
and names what was asked (model, target, the version the alias points at, a pass for the
tenant), and the manifest it then installs is the one the statement names, with the same
target, source and build key.

Why in the version's tags (``quantgate.approval`` and ``quantgate.approval_sig``) and not in the
store: pull reads the version's tags anyway to follow the alias, so a cache hit stays two
tracking-server calls and no store request, and an offline pull checks the copy it remembered.
A statement is about 1 kB and its signature about 1.4 kB; MLflow keeps 100,000 characters per
model-version tag.

Re-gating the same content merges: the tenants this report judged take its verdicts, the others
keep those of the statement already there (used only once it verifies under the publisher's own
key), so a report that gated one tenant never revokes another's approval, and a tenant that now
fails loses its pass in the statement as well as its alias.

What it cannot stop: someone who can write the registry can put back an older statement of the
same version signed by the same key, together with its alias (a rollback to an approval since
withdrawn). The signing key is the root of trust; see artifacts_registry/README.md.
"""

from __future__ import annotations

import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError

from quantgate.contracts.artifact import Manifest
from quantgate.publish import naming, signing
from quantgate.publish.config import RegistryConfig
from quantgate.runtime.errors import SignatureError, TamperedArtifactError, UnapprovedVersionError
from quantgate.runtime.frozen import FrozenRecord

FILE = "approval.json"  # the statement's name while it is signed and verified (never stored)
# a statement of 10,000 tenants is under 1 MB; the tags are refused beyond this before anything parses them
MAX_STATEMENT_CHARS = 1_000_000
MAX_SIGNATURE_CHARS = signing.MAX_SIGNATURE_BYTES

Verdict = Literal["pass", "fail"]


class Approval(FrozenRecord):
    """The signed statement: the gate's verdicts on exactly one version of one registered model."""

    kind: Literal["quantgate.approval"] = "quantgate.approval"
    schema_version: Literal[1] = 1
    registered_model: str
    model: str
    target: str
    version: str  # the registered model's version this statement is about
    verdicts: dict[str, Verdict]  # tenant -> the gate's verdict, for every tenant ever judged
    source_hash: str
    build_key: str
    content_hash: str
    manifest_sha256: str
    report_sha256: str  # the report that last changed a verdict
    signed_at: str
    # the v2 info-hash of the version's torrent (manifest.torrent): the swarm a node may fetch it from.
    # Absent from the text when None, so a statement without one is signed as before.
    torrent: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")

    def approves(self, tenant: str) -> bool:
        """Whether the gate passed ``tenant`` on this version."""
        return self.verdicts.get(tenant) == "pass"

    @property
    def tenants(self) -> list[str]:
        """The tenants the gate approved, sorted."""
        return sorted(t for t, v in self.verdicts.items() if v == "pass")

    def text(self) -> str:
        """The exact text that is signed and stored (canonical JSON)."""
        return self.model_dump_json(exclude={"torrent"} if self.torrent is None else None)


def statement(
    *,
    registered_model: str,
    model: str,
    version: str,
    manifest: Manifest,
    content_hash: str,
    manifest_sha256: str,
    report_sha256: str,
    verdicts: dict[str, Verdict],
    torrent: str | None = None,
) -> Approval:
    """A statement about ``version`` with these verdicts, stamped now."""
    return Approval(
        registered_model=registered_model,
        model=model,
        target=manifest.target,
        version=str(version),
        verdicts=dict(sorted(verdicts.items())),
        source_hash=manifest.source.content_hash,
        build_key=manifest.build_key,
        content_hash=content_hash,
        manifest_sha256=manifest_sha256,
        report_sha256=report_sha256,
        signed_at=statement_time(),
        torrent=torrent,
    )


def statement_time() -> str:
    """Now, as statements record it (UTC, seconds)."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def sign(approval: Approval, cfg: RegistryConfig) -> dict[str, str]:
    """The version tags that carry ``approval`` and its signature (with the publisher's key)."""
    text = approval.text()
    with tempfile.TemporaryDirectory(prefix="quantgate-approval-") as tmp:
        path = Path(tmp) / FILE
        path.write_text(text)
        signature = signing.sign(path, cfg)
    return {naming.APPROVAL: text, naming.APPROVAL_SIGNATURE: signature.decode()}


def _verified_text(text: str, signature: str, where: str, cfg: RegistryConfig, keys=None) -> Approval:
    """The statement in ``text`` once its signature verifies (``keys``: these public keys, else
    the fleet's trusted keys); SignatureError naming ``where`` otherwise."""
    if len(text) > MAX_STATEMENT_CHARS or len(signature) > MAX_SIGNATURE_CHARS:
        raise SignatureError(
            where,
            f"the approval or its signature is longer than quantgate writes ({len(text):,} and "
            f"{len(signature):,} characters)",
            "re-publish the version from its gate report; the registry was altered",
        )
    with tempfile.TemporaryDirectory(prefix="quantgate-approval-") as tmp:
        path = Path(tmp) / FILE
        path.write_text(text)
        signing.verify(path, signature.encode(), cfg, where, keys=keys)
    try:
        return Approval.model_validate_json(text)
    except ValidationError:  # signed, yet not a statement: a key used for something else
        raise SignatureError(
            where, "the signed approval is not a quantgate approval statement", "re-publish the version"
        ) from None


def from_tags(tags: dict[str, str], where: str, cfg: RegistryConfig) -> Approval:
    """The version's statement, verified under the fleet's trusted keys (SignatureError otherwise)."""
    text, signature = tags.get(naming.APPROVAL), tags.get(naming.APPROVAL_SIGNATURE)
    if not text or not signature:
        raise SignatureError(
            where,
            "the version has no signed approval (published by an older quantgate, or the tag was removed)",
            "publish its gate report again (quantgate publish --report R --artifacts D): that signs the "
            "gate's approval; nothing was installed",
        )
    return _verified_text(text, signature, where, cfg)


def previous(tags: dict[str, str], cfg: RegistryConfig) -> Approval | None:
    """The statement already on a version, if the publisher's own key signed it; else None (the
    merge then starts from this report's verdicts alone)."""
    text, signature = tags.get(naming.APPROVAL), tags.get(naming.APPROVAL_SIGNATURE)
    if not text or not signature:
        return None
    with tempfile.TemporaryDirectory(prefix="quantgate-key-") as tmp:
        own = signing.public_key_file(signing.signing_key(cfg), Path(tmp))
        try:
            return _verified_text(text, signature, "approval", cfg, keys=(own,))
        except SignatureError:
            return None


def merged(before: Approval | None, judged: dict[str, Verdict]) -> dict[str, Verdict]:
    """The verdicts of ``before`` updated with the ones this report ``judged``."""
    return {**(before.verdicts if before is not None else {}), **judged}


def check(
    approval: Approval,
    *,
    registered_model: str,
    model: str,
    target: str,
    version: str,
    tenant: str,
    allow_unapproved: bool,
    where: str,
) -> None:
    """Refuse (exit 2, one line naming ``where``) a statement that is not about what was asked, or
    that does not approve ``tenant`` (unless ``allow_unapproved``: a non-serving test)."""
    asked = {"registered model": registered_model, "model": model, "target": target, "version": version}
    said = {
        "registered model": approval.registered_model,
        "model": approval.model,
        "target": approval.target,
        "version": approval.version,
    }
    for field, value in asked.items():
        if said[field] != value:
            raise TamperedArtifactError(
                where,
                f"the signed approval is about {field} '{said[field]}', not the '{value}' asked for "
                "(the registry points this name at another artifact)",
                "re-publish the right artifact from its gate report; nothing was installed",
            )
    if not approval.approves(tenant) and not allow_unapproved:
        verdict = approval.verdicts.get(tenant)
        raise UnapprovedVersionError(
            where,
            f"the gate did not approve version {version} of '{registered_model}' for tenant '{tenant}' "
            f"({'it failed' if verdict else 'not gated for it'}; signed approval: "
            f"{', '.join(approval.tenants) or 'no tenant'}), though the alias points at it",
            "point the alias back at an approved version (quantgate publish of its report); nothing was installed",
        )


def manifest_problem(manifest: Manifest, approval: Approval) -> str | None:
    """Why ``manifest`` is not the artifact ``approval`` is about (target, source, build key), or None."""
    pairs = {
        "target": (manifest.target, approval.target),
        "source hash": (manifest.source.content_hash, approval.source_hash),
        "build key": (manifest.build_key, approval.build_key),
    }
    for field, (found, expected) in pairs.items():
        if found != expected:
            return f"names {field} '{found}', but the signed approval is about '{expected}'"
    return None
