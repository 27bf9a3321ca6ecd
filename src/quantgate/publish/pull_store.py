"""What ``pull`` reads from a version's store, each checked before it is trusted: the manifest
(the one the signed approval names, signed by a trusted key, about the approved artifact, with
safe names), its signature and the torrent (refused by size before a byte is read), and each
file against the manifest. A store's copy that fails a check is tampering (exit 2, naming the
store's file and the fix); a store that cannot be reached is transient (exit 75).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from quantgate.contracts.artifact import MANIFEST, MAX_MANIFEST_BYTES, Manifest
from quantgate.fleet import MAX_TORRENT_BYTES, TORRENT, load_torrent
from quantgate.publish import approval, signing
from quantgate.publish.approval import Approval
from quantgate.publish.config import RegistryConfig
from quantgate.publish.resolve import Resolved
from quantgate.publish.store import ArtifactStore
from quantgate.runtime.errors import RegistryUnavailableError, TamperedArtifactError, UnsafePathError
from quantgate.runtime.hashing import FileEntry, content_hash, file_problem, sha256_file
from quantgate.runtime.safe_path import safe_relpath


def tampered(rel: str, resolved: Resolved, problem: str) -> TamperedArtifactError:
    """The refusal (exit 2) of the store's ``rel`` of ``resolved``, for ``problem``."""
    return TamperedArtifactError(
        f"{resolved.source}/{rel}",
        f"{problem} (version {resolved.version} of {resolved.registered_model})",
        "the store's copy was altered or damaged: re-publish the artifact from its build and "
        "its gate report; nothing was installed",
    )


def bounded_download(store: ArtifactStore, rel: str, staging: Path, limit: int, resolved: Resolved) -> bool:
    """Download ``rel`` into ``staging`` unless the store holds none (False); refused by its size,
    before a byte of it is read, past ``limit`` (asked of the store, then checked on disk)."""
    size = store.size(rel)
    if size is None:
        return False
    if size <= limit:
        try:
            store.download({rel: size}, staging, lambda r, path: None, lambda n: None)
        except FileNotFoundError:
            return False
        size = (staging / rel).stat().st_size
    if size > limit:
        (staging / rel).unlink(missing_ok=True)
        if rel == signing.SIGNATURE:
            raise signing.too_large(f"{resolved.source}/{rel}", size)
        raise tampered(rel, resolved, f"is {size:,} bytes, over the {limit:,}-byte limit; it was not read")
    return True


def store_manifest(
    store: ArtifactStore, staging: Path, resolved: Resolved, signed: Approval, cfg: RegistryConfig
) -> tuple[Manifest, bytes]:
    """The manifest from the store and its signature, trusted only if it is the one the signed
    approval names, signed by a trusted key, about the approved target, source and build key,
    and every file name in it is safe."""
    signing.trusted_keys(cfg)  # refused before a byte is downloaded when none are configured
    if not bounded_download(store, MANIFEST, staging, MAX_MANIFEST_BYTES, resolved):
        raise tampered(MANIFEST, resolved, "missing from the store")
    if sha256_file(staging / MANIFEST).sha256 != signed.manifest_sha256:
        raise tampered(MANIFEST, resolved, "differs from the manifest registered at publish")
    signature = None
    try:
        if bounded_download(store, signing.SIGNATURE, staging, signing.MAX_SIGNATURE_BYTES, resolved):
            signature = (staging / signing.SIGNATURE).read_bytes()
    finally:
        (staging / signing.SIGNATURE).unlink(missing_ok=True)  # kept in the install record only
    return checked_manifest(staging, signature, resolved, signed, cfg), signature or b""


def checked_manifest(
    staging: Path, signature: bytes | None, resolved: Resolved, signed: Approval, cfg: RegistryConfig
) -> Manifest:
    """``staging/manifest.json`` (from the store or the swarm) once it is the approved one, signed
    by a trusted key, valid, and about the approved artifact (see ``store_manifest``)."""
    if sha256_file(staging / MANIFEST).sha256 != signed.manifest_sha256:
        raise tampered(MANIFEST, resolved, "differs from the manifest registered at publish")
    signing.verify(staging / MANIFEST, signature, cfg, f"{resolved.source}/{MANIFEST}")
    assert signature is not None  # verify refuses an unsigned manifest
    try:
        manifest = Manifest.model_validate_json((staging / MANIFEST).read_text())
    except ValidationError:
        raise tampered(MANIFEST, resolved, "is not a valid manifest") from None
    for rel in manifest.files:  # a bad name from the store is tampering, not the caller's input
        try:
            safe_relpath(rel, f"{resolved.source}/{MANIFEST}")
        except UnsafePathError as exc:
            raise tampered(MANIFEST, resolved, exc.problem) from None
        if rel in (MANIFEST, signing.SIGNATURE, TORRENT):
            raise tampered(MANIFEST, resolved, f"file name {rel!r} is reserved")
    if content_hash(manifest.files) != signed.content_hash:
        raise tampered(MANIFEST, resolved, "does not match the version's content hash")
    if (problem := approval.manifest_problem(manifest, signed)) is not None:
        raise tampered(MANIFEST, resolved, problem)
    # the tokenizer and templates must be the source's, as the build recorded them; each file is
    # then checked against manifest.files, so the bytes installed are the source's
    for rel, source_sha in sorted((manifest.source_files or {}).items()):
        entry = manifest.files.get(rel)
        if entry is None or entry.sha256 != source_sha:
            found = f"sha256 {entry.sha256}" if entry else "absent"
            raise tampered(
                rel, resolved, f"is not the source's ({found}, the source's is sha256 {source_sha})"
            )
    return manifest


def file_problem_or_missing(path: Path, entry: FileEntry) -> str | None:
    """Why the file at ``path`` is not the manifest's ``entry`` (absent included), or None."""
    return "missing after download" if not path.is_file() else file_problem(path, entry)


def store_torrent(
    store: ArtifactStore, staging: Path, resolved: Resolved, info_hash: str
) -> tuple[bytes | None, bool]:
    """(the version's torrent from the store, its signed part, checked against the signed
    info-hash: exit 2 otherwise; whether the store answered). (None, True): the store lost it;
    (None, False): the store cannot be reached (the peers have it then, by its info-hash)."""
    try:
        found = bounded_download(store, TORRENT, staging, MAX_TORRENT_BYTES, resolved)
    except RegistryUnavailableError:
        return None, False
    if not found:
        return None, True
    data = (staging / TORRENT).read_bytes()
    (staging / TORRENT).unlink()
    try:
        return load_torrent(data, info_hash, staging.name).data, True
    except ValueError as exc:
        raise tampered(TORRENT, resolved, f"is not the signed torrent: it {exc}") from None
