"""``quantgate pull``: the approved artifact for a (model, target, tenant), verified, local.

Resolving the alias takes two tracking-server calls (the model's aliases, the version's tags).
Before a byte is read, the version's signed approval (``approval``, in its tags) must verify
under a key the fleet trusts and name what was asked: the model, the target, the version the
alias points at, and a pass for the tenant (a version the gate failed, another model's artifact
registered under this name, a build of another target: refused, exit 2, one line). The
approval names the manifest, and the manifest's sha256 names the cache entry: the bytes come
from the local cache when that manifest was installed before (so pulling rocm-cdna3-fp8 after
hopper-fp8, the same files under two manifests, installs each under its own), else from the
store: the manifest first, checked against the approval's sha256 and its target, source and
build key, against the registered content hash, and for support files (tokenizer, templates)
that are the source's, as the build recorded them, and whose signature (``manifest.sig``, at
most ``signing.MAX_SIGNATURE_BYTES``, refused by its size before it is downloaded) is by a key
the fleet trusts; then every file in parallel, each re-hashed against it. Every name from the
manifest, the registry's tags or the cache index passes ``safe_path`` first. Only a wholly
verified set is installed; a failed pull installs nothing and keeps the files it verified, so
the next attempt resumes; a full disk (exit 75) keeps nothing. ``offline`` skips the tracking
server and uses the version (and signed approval) this node last resolved for the same alias.

A cache hit is checked before it is served (``PullCache.problem``): re-hashed on every pull
(``pull_verify: always``, the default) or on ``--offline`` pulls only (``offline``: online hits
compare stats), its signature verified again against today's trusted keys, and its manifest
again against the approval. A damaged entry is evicted: online it is downloaded again, offline
the pull is refused naming the file.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from quantgate.config import cache_dir as default_cache_dir
from quantgate.contracts.artifact import MANIFEST, Manifest
from quantgate.fleet import TORRENT
from quantgate.publish import approval, naming, signing, tracking
from quantgate.publish.approval import Approval
from quantgate.publish.cache import ENTRY, PullCache
from quantgate.publish.config import RegistryConfig
from quantgate.publish.dest import materialize
from quantgate.publish.pull_fleet import fetch_from_fleet
from quantgate.publish.pull_release import ReleaseCheck
from quantgate.publish.pull_store import file_problem_or_missing, store_manifest, store_torrent, tampered
from quantgate.publish.resolve import Resolved, resolve
from quantgate.publish.store import ArtifactStore
from quantgate.publish.stores import open_store, range_reader
from quantgate.runtime.errors import (
    DiskFullError,
    QuantgateError,
    SignatureError,
    TamperedArtifactError,
    UnapprovedVersionError,
    UsageError,
)
from quantgate.runtime.hashing import content_hash
from quantgate.runtime.progress import SILENT, Progress

HASH_THREADS = 2  # hashing overlaps the downloads still in flight


def pull(
    model: str,
    target: str,
    tenant: str,
    cfg: RegistryConfig,
    cache_dir: Path | None = None,
    dest: Path | None = None,
    allow_unapproved: bool = False,
    progress: Progress = SILENT,
    *,
    version: str | None = None,
    offline: bool = False,
    link: bool = False,
    channel: str = "stable",
) -> Path:
    """Return the local path of the verified artifact (``dest`` if given, else the cache entry).

    ``link``: ``dest`` gets hard links into the cache instead of copies (see ``dest``).
    ``channel``: ``stable`` (``approved-<tenant>``) or ``canary`` (``canary-<tenant>``, a rollout's
    canary, checked against the canary channel's signed record the same way).
    """
    name = naming.registered_model_name(model, target)
    naming.alias_for(tenant)  # a tenant that cannot be an alias is a usage error, online or not
    cache = PullCache(Path(cache_dir or default_cache_dir()) / "pull", cfg.cache_max_bytes)
    if channel not in ("stable", "canary"):
        raise UsageError(
            "--channel", f"'{channel}' is not a channel", "pass --channel stable or --channel canary"
        )
    key = f"{cfg.model_registry_uri} {name} {version or naming.channel_alias(tenant, channel)}"
    asked = _Asked(name, model, target, tenant, allow_unapproved)
    released = ReleaseCheck(name, tenant, cfg, cache.root, "canary" if channel == "canary" else "stable")
    with _disk_full(cache, name):
        if offline:
            path = _offline(cache, key, asked, cfg, released)
        else:
            with tracking.registry_errors(cfg):
                resolved = resolve(
                    tracking.client(cfg),
                    name,
                    tenant,
                    version,
                    allow_unapproved,
                    on_model=None if allow_unapproved else released,
                    channel=channel,
                )
            if not ENTRY.match(resolved.content_hash):
                raise tampered(MANIFEST, resolved, "has a content hash tag that is not a sha256")
            signed = _approved(resolved, asked, cfg)
            if not allow_unapproved:
                released.agrees(signed, resolved.version, resolved.where)
            cache.remember(
                key,
                {
                    "version": resolved.version,
                    "manifest_sha256": signed.manifest_sha256,
                    "approved": str(resolved.approved and signed.approves(tenant)).lower(),
                    naming.APPROVAL: resolved.tags[naming.APPROVAL],
                    naming.APPROVAL_SIGNATURE: resolved.tags[naming.APPROVAL_SIGNATURE],
                    **released.remembered,
                },
            )
            hit = _checked_hit(cache, signed, cfg, cfg.pull_verify == "always", progress)
            if hit is None:
                progress.log(
                    f"{name} version {resolved.version}: not cached, downloading from {resolved.source}"
                )
            path = hit if hit is not None else _fetch(resolved, signed, cache, cfg, progress)
        return materialize(path, dest, link=link) if dest is not None else path


@dataclass(frozen=True)
class _Asked:
    """What the caller asked for, which the signed approval must name."""

    name: str  # the registered model
    model: str
    target: str
    tenant: str
    allow_unapproved: bool


def _check(signed: Approval, asked: _Asked, version: str, where: str) -> None:
    approval.check(
        signed,
        registered_model=asked.name,
        model=asked.model,
        target=asked.target,
        version=version,
        tenant=asked.tenant,
        allow_unapproved=asked.allow_unapproved,
        where=where,
    )


def _approved(resolved: Resolved, asked: _Asked, cfg: RegistryConfig) -> Approval:
    """The version's signed approval, verified and about what was asked, and agreeing with the
    version's tags (content hash, manifest): refused (exit 2) otherwise, before any download."""
    signed = approval.from_tags(resolved.tags, resolved.where, cfg)
    _check(signed, asked, resolved.version, resolved.where)
    if (signed.content_hash, signed.manifest_sha256) != (resolved.content_hash, resolved.manifest_sha256):
        raise tampered(
            MANIFEST, resolved, "is not the manifest the signed approval names (registry tags altered)"
        )
    if not ENTRY.match(signed.manifest_sha256):
        raise tampered(MANIFEST, resolved, "has a manifest sha256 in its approval that is not a sha256")
    tagged = resolved.tags.get(naming.TORRENT)
    if tagged is not None and tagged != signed.torrent:
        raise tampered(
            TORRENT,
            resolved,
            f"is named by a torrent info-hash ({tagged[:16]}...) that the signed approval "
            + (
                "does not name"
                if signed.torrent is None
                else f"does not name (it names {signed.torrent[:16]}...)"
            ),
        )
    return signed


@contextlib.contextmanager
def _disk_full(cache: PullCache, name: str) -> Iterator[None]:
    """A full disk (or quota) anywhere in a pull: exit 75 in one line, with nothing partial kept
    (the staging directories of this pull are dropped to give the space back)."""
    try:
        yield
    except (OSError, DiskFullError) as exc:
        if isinstance(exc, OSError) and exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        partial = cache.root / ".partial"
        for staged in partial.iterdir() if partial.is_dir() else []:
            if staged.is_dir() and ENTRY.match(staged.name):
                cache.discard_staging(staged.name)
        if isinstance(exc, DiskFullError):
            raise  # already one line naming the path (atomic's writes)
        raise DiskFullError(
            f"{exc.filename or cache.root}: no space left on device while pulling {name}; nothing was installed. Fix: free "
            "space there (or lower QUANTGATE_PULL_CACHE_MAX_GB) and pull again"
        ) from None


def _checked_hit(
    cache: PullCache, signed: Approval, cfg: RegistryConfig, rehash: bool, progress: Progress
) -> Path | None:
    """The cache entry of the approved manifest if it is installed and intact, else None (online:
    a damaged entry is evicted, to be downloaded again)."""
    path = cache.entry(signed.manifest_sha256)
    if not (path / MANIFEST).is_file():
        return None
    damage = _damage(cache, signed, cfg, rehash)
    if damage is None:
        cache.touch(path)
        return path
    cache.remove(signed.manifest_sha256)
    progress.log(f"{path / damage[0]}: {damage[1]}; the cached copy was evicted, downloading it again")
    return None


def _damage(cache: PullCache, signed: Approval, cfg: RegistryConfig, rehash: bool) -> tuple[str, str] | None:
    """(file, why) when the entry is not what was verified and installed, its signature is by
    no key trusted today, or its manifest is not the artifact the approval is about; None when
    it may be served."""
    signing.trusted_keys(cfg)  # none configured is the configuration's problem, not the entry's
    entry = signed.manifest_sha256
    found = cache.problem(entry, rehash)
    if found is not None:
        return found
    manifest = cache.entry(entry) / MANIFEST
    signature = (cache.record(entry) or {}).get("signature")
    try:
        signing.verify(
            manifest, signature.encode() if isinstance(signature, str) else None, cfg, str(manifest)
        )
    except SignatureError as exc:
        return MANIFEST, exc.problem
    installed = Manifest.model_validate_json(manifest.read_text())  # valid: cache.problem read it
    problem = approval.manifest_problem(installed, signed)
    if problem is None and content_hash(installed.files) != signed.content_hash:
        problem = "holds other files than the signed approval names"
    return (MANIFEST, problem) if problem is not None else None


def _offline(cache: PullCache, key: str, asked: _Asked, cfg: RegistryConfig, released: ReleaseCheck) -> Path:
    record = cache.index().get(key)
    entry = record.get("manifest_sha256") if isinstance(record, dict) else None
    path = cache.entry(entry) if isinstance(entry, str) and ENTRY.match(entry) else None
    if record is None or path is None or not (path / MANIFEST).is_file():
        raise UsageError(
            "--offline",
            f"this node has no cached pull for {key.split(' ', 1)[1]}",
            "pull once with the registry reachable, then --offline works",
        )
    version = str(record.get("version"))
    where = f"{cache.root / 'index.json'}: {asked.name} version {version}"
    text, signature = record.get(naming.APPROVAL), record.get(naming.APPROVAL_SIGNATURE)
    signed = approval.from_tags(
        {
            k: v
            for k, v in ((naming.APPROVAL, text), (naming.APPROVAL_SIGNATURE, signature))
            if isinstance(v, str)
        },
        where,
        cfg,
    )
    if signed.manifest_sha256 != entry:
        raise TamperedArtifactError(
            where, "the cached resolution names another manifest than its signed approval", "pull online"
        )
    if record.get("approved") != "true" and not asked.allow_unapproved:
        raise UnapprovedVersionError(
            None,
            f"the cached version {version} was not approved when pulled",
            "pass --allow-unapproved, or pull online",
        )
    _check(signed, asked, version, where)
    if not asked.allow_unapproved:  # the remembered release, against the newest this node verified
        released.offline(record, version, signed, where)
    damage = _damage(cache, signed, cfg, rehash=True)  # offline: always by content
    if damage is not None:
        cache.remove(entry)
        raise TamperedArtifactError(
            path / damage[0],
            f"{damage[1]} (cached copy of version {version})",
            "the copy on this node was altered and has been evicted; pull online to download it again",
        )
    cache.touch(path)
    return path


def _fetch(
    resolved: Resolved, signed: Approval, cache: PullCache, cfg: RegistryConfig, progress: Progress
) -> Path:
    entry = signed.manifest_sha256
    with cache.lock(entry):
        hit = _checked_hit(cache, signed, cfg, False, progress)  # a concurrent pull's
        if hit is not None:
            return hit
        store = open_store(resolved.source, cfg)
        reader = range_reader(store) if signed.torrent and cfg.fleet.peers else None
        if reader is not None and signed.torrent is not None:  # peers first, the origin last
            path = fetch_from_fleet(resolved, signed, signed.torrent, cache, cfg, store, reader, progress)
            if path is not None:
                return path
        return _from_origin(resolved, signed, cache, cfg, store, progress)


def _from_origin(
    resolved: Resolved,
    signed: Approval,
    cache: PullCache,
    cfg: RegistryConfig,
    store: ArtifactStore,
    progress: Progress,
) -> Path:
    """Every file from the store (the origin), each re-hashed against the checked manifest."""
    entry = signed.manifest_sha256
    staging = cache.staging(entry)
    manifest, signature = store_manifest(store, staging, resolved, signed, cfg)
    for stray in [p for p in staging.rglob("*") if p.is_file() or p.is_symlink()]:
        if stray.is_symlink() or stray.relative_to(staging).as_posix() not in {*manifest.files, MANIFEST}:
            stray.unlink()
    cache.evict(keep=entry, incoming=manifest.total_bytes)  # room first
    # files verified by an interrupted pull stay; only the rest is downloaded
    todo = {
        rel: e.bytes
        for rel, e in manifest.files.items()
        if file_problem_or_missing(staging / rel, e) is not None
    }
    checks: dict[str, Future] = {}
    total = sum(todo.values())
    with (
        ThreadPoolExecutor(HASH_THREADS) as hashers,
        progress.task(f"pull {resolved.registered_model} v{resolved.version}", total) as bar,
    ):

        def hash_later(rel: str, path: Path) -> None:
            checks[rel] = hashers.submit(file_problem_or_missing, path, manifest.files[rel])

        try:
            store.download(todo, staging, hash_later, bar.advance)
        except FileNotFoundError as exc:  # stores raise it with the relative path
            raise tampered(str(exc.args[0]), resolved, "missing from the store") from None
        problems = {rel: f.result() for rel, f in checks.items()}
    bad = {rel: problem for rel, problem in problems.items() if problem}
    if bad:
        for rel in bad:
            (staging / rel).unlink(missing_ok=True)
        rel, problem = next(iter(sorted(bad.items())))
        more = f"; {len(bad) - 1} more file(s) too" if len(bad) > 1 else ""
        raise tampered(rel, resolved, problem + more)
    path = cache.install(entry, staging, {"signature": signature.decode()})
    if signed.torrent is not None:  # kept for `quantgate seed`, once the store's copy is the signed one
        # (best effort: the artifact is installed; a store that fails now only means no seeding)
        with contextlib.suppress(QuantgateError, OSError):
            torrent_data, _ = store_torrent(store, cache.staging(entry), resolved, signed.torrent)
            if torrent_data is not None:
                cache.keep_torrent(entry, torrent_data)
        cache.discard_staging(entry)
    return path
