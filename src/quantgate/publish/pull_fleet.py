"""``pull`` through the fleet (``quantgate.fleet``): the bytes from peers first and the origin last,
with the same checks of the manifest and of every file before the same install as the origin path.

The torrent comes from the store (its signed part: ``fleet.torrent.signed_part``) or, when the
store cannot be reached, from the peers by its signed info-hash. A store that answers but lost
its torrent gives the peers ``METADATA_WAIT_S`` to send it; past that the pull is the origin's
alone (``fetch_from_fleet`` returns None and ``pull`` reads every file from the store), where it
used to wait for peers that never answered and end in exit 75 on every retry.
"""

from __future__ import annotations

from pathlib import Path

from quantgate.contracts.artifact import MANIFEST, Manifest
from quantgate.fleet import (
    METADATA_WAIT_S,
    TORRENT,
    NoTorrent,
    RangeReader,
    TorrentRefused,
    fetch_version,
    open_node,
)
from quantgate.publish import signing
from quantgate.publish.approval import Approval
from quantgate.publish.cache import PullCache
from quantgate.publish.config import RegistryConfig
from quantgate.publish.pull_store import checked_manifest, file_problem_or_missing, store_torrent, tampered
from quantgate.publish.resolve import Resolved
from quantgate.publish.store import ArtifactStore
from quantgate.runtime.hashing import per_file
from quantgate.runtime.progress import Progress


def fetch_from_fleet(
    resolved: Resolved,
    signed: Approval,
    info_hash: str,
    cache: PullCache,
    cfg: RegistryConfig,
    store: ArtifactStore,
    reader: RangeReader,
    progress: Progress,
) -> Path | None:
    """The installed entry, fetched from peers and the origin; None when the store lost the
    torrent and no peer sent it in time (the caller then reads every file from the store)."""
    entry = signed.manifest_sha256
    staging = cache.staging(entry)
    signing.trusted_keys(cfg)  # refused before a byte is fetched when none are configured
    torrent_data, store_answered = store_torrent(store, staging, resolved, info_hash)

    def verify(path: Path, signature: bytes) -> Manifest:
        manifest = checked_manifest(path.parent, signature or None, resolved, signed, cfg)
        cache.evict(keep=entry, incoming=manifest.total_bytes)  # room first
        return manifest

    try:
        with open_node(cfg.fleet) as node:
            manifest, signature, torrent_data, transfer = fetch_version(
                node,
                info_hash=info_hash,
                name=entry,
                save_path=staging.parent,
                torrent_data=torrent_data,
                reader=reader,
                verify_manifest=verify,
                concurrency=cfg.transfer.concurrency,
                where=resolved.source,
                progress=progress,
                metadata_wait_s=METADATA_WAIT_S if torrent_data is None and store_answered else None,
            )
    except TorrentRefused as exc:
        raise tampered(TORRENT, resolved, f"swarm refused: it {exc}") from None
    except NoTorrent as exc:
        progress.log(f"{resolved.source}/{TORRENT}: missing from the store and {exc}; reading the origin")
        return None
    (staging / signing.SIGNATURE).unlink(missing_ok=True)  # kept in the install record only
    for stray in [p for p in staging.rglob("*") if p.is_file() or p.is_symlink()]:
        if stray.is_symlink() or stray.relative_to(staging).as_posix() not in {*manifest.files, MANIFEST}:
            stray.unlink()
    rels = sorted(manifest.files)
    found = per_file(lambda rel: file_problem_or_missing(staging / rel, manifest.files[rel]), rels, "verify")
    bad = {rel: problem for rel, problem in zip(rels, found, strict=True) if problem}
    if bad:  # the merkle tree and the manifest disagree: the publish made them from other bytes
        for rel in bad:
            (staging / rel).unlink(missing_ok=True)
        rel, problem = next(iter(sorted(bad.items())))
        raise tampered(
            rel, resolved, problem + (f"; {len(bad) - 1} more file(s) too" if len(bad) > 1 else "")
        )
    progress.log(f"{resolved.registered_model} version {resolved.version}: {transfer.describe()}")
    path = cache.install(
        entry,
        staging,
        {
            "signature": signature.decode(),
            "peer_bytes": str(transfer.peer_bytes),
            "origin_bytes": str(transfer.origin_bytes),
            "bad_pieces": str(transfer.bad_pieces),
            "stalled_peers": str(transfer.stalled),
        },
    )
    if torrent_data is not None:
        cache.keep_torrent(entry, torrent_data)
    return path
