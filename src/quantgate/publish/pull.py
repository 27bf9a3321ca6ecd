"""``quantgate pull``: the approved artifact for a (model, target, tenant), verified, local.

Resolving the alias takes two tracking-server calls (the model's aliases, the version's tags);
the bytes come from the local content-addressed cache when this content was pulled before,
else from the store: the manifest first, checked against the sha256 the version recorded at
publish (a manifest swapped in the store is caught) and for support files (tokenizer, templates)
that are the source's, as the build recorded them, then every file in parallel, each re-hashed
against it. Only a wholly verified set is installed; a failed pull installs nothing
and keeps the files it verified, so the next attempt resumes. ``offline`` skips the tracking
server and uses the version this node last resolved for the same alias.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from pydantic import ValidationError

from quantgate.artifact import MANIFEST, Manifest
from quantgate.errors import TamperedArtifactError, UnapprovedVersionError, UsageError
from quantgate.hashing import FileEntry, content_hash, file_problem, sha256_file
from quantgate.paths import cache_dir as default_cache_dir
from quantgate.progress import SILENT, Progress
from quantgate.publish import naming, tracking
from quantgate.publish.cache import PullCache
from quantgate.publish.config import RegistryConfig
from quantgate.publish.dest import materialize
from quantgate.publish.resolve import Resolved, resolve
from quantgate.publish.store import ArtifactStore, open_store

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
) -> Path:
    """Return the local path of the verified artifact (``dest`` if given, else the cache entry)."""
    name = naming.registered_model_name(model, target)
    cache = PullCache(Path(cache_dir or default_cache_dir()) / "pull", cfg.cache_max_bytes)
    key = f"{cfg.model_registry_uri} {name} {version or naming.alias_for(tenant)}"
    if offline:
        path = _offline(cache, key, allow_unapproved)
    else:
        with tracking.registry_errors(cfg):
            resolved = resolve(tracking.client(cfg), name, tenant, version, allow_unapproved)
        cache.remember(
            key,
            {
                "version": resolved.version,
                "content_hash": resolved.content_hash,
                "approved": str(resolved.approved).lower(),
            },
        )
        hit = cache.lookup(resolved.content_hash)
        if hit is None:
            progress.log(f"{name} version {resolved.version}: not cached, downloading from {resolved.source}")
        path = hit if hit is not None else _fetch(resolved, cache, cfg, progress)
    return materialize(path, dest) if dest is not None else path


def _offline(cache: PullCache, key: str, allow_unapproved: bool) -> Path:
    record = cache.index().get(key)
    path = cache.lookup(record["content_hash"]) if record else None
    if record is None or path is None:
        raise UsageError(
            "--offline",
            f"this node has no cached pull for {key.split(' ', 1)[1]}",
            "pull once with the registry reachable, then --offline works",
        )
    if record.get("approved") != "true" and not allow_unapproved:
        raise UnapprovedVersionError(
            None,
            f"the cached version {record['version']} was not approved when pulled",
            "pass --allow-unapproved, or pull online",
        )
    return path


def _tampered(rel: str, resolved: Resolved, problem: str) -> TamperedArtifactError:
    return TamperedArtifactError(
        f"{resolved.source}/{rel}",
        f"{problem} (version {resolved.version} of {resolved.registered_model})",
        "the store's copy was altered or damaged: re-publish the artifact from its build and "
        "its gate report; nothing was installed",
    )


def _safe_rel(rel: str) -> bool:
    return (
        bool(rel)
        and not rel.startswith("/")
        and "\\" not in rel
        and ".." not in rel.split("/")
        and rel != MANIFEST
    )


def _manifest(store: ArtifactStore, staging: Path, resolved: Resolved) -> Manifest:
    """The manifest from the store, trusted only if it is the one the version registered."""
    try:
        store.download({MANIFEST: 0}, staging, lambda rel, path: None, lambda n: None)
    except FileNotFoundError:
        raise _tampered(MANIFEST, resolved, "missing from the store") from None
    if sha256_file(staging / MANIFEST).sha256 != resolved.manifest_sha256:
        raise _tampered(MANIFEST, resolved, "differs from the manifest registered at publish")
    try:
        manifest = Manifest.model_validate_json((staging / MANIFEST).read_text())
    except ValidationError:
        raise _tampered(MANIFEST, resolved, "is not a valid manifest") from None
    if content_hash(manifest.files) != resolved.content_hash or not all(map(_safe_rel, manifest.files)):
        raise _tampered(MANIFEST, resolved, "does not match the version's content hash")
    # the tokenizer and templates must be the source's, as the build recorded them; each file is
    # then checked against manifest.files, so the bytes installed are the source's
    for rel, source_sha in sorted((manifest.source_files or {}).items()):
        entry = manifest.files.get(rel)
        if entry is None or entry.sha256 != source_sha:
            found = f"sha256 {entry.sha256}" if entry else "absent"
            raise _tampered(
                rel, resolved, f"is not the source's ({found}, the source's is sha256 {source_sha})"
            )
    return manifest


def _problem(path: Path, entry: FileEntry) -> str | None:
    return "missing after download" if not path.is_file() else file_problem(path, entry)


def _fetch(resolved: Resolved, cache: PullCache, cfg: RegistryConfig, progress: Progress) -> Path:
    with cache.lock(resolved.content_hash):
        hit = cache.lookup(resolved.content_hash)  # installed by a concurrent pull meanwhile
        if hit is not None:
            return hit
        staging = cache.staging(resolved.content_hash)
        store = open_store(resolved.source, cfg)
        manifest = _manifest(store, staging, resolved)
        for stray in [p for p in staging.rglob("*") if p.is_file()]:
            if stray.relative_to(staging).as_posix() not in {*manifest.files, MANIFEST}:
                stray.unlink()
        # files verified by an interrupted pull stay; only the rest is downloaded
        todo = {rel: e.bytes for rel, e in manifest.files.items() if _problem(staging / rel, e) is not None}
        checks: dict[str, Future] = {}
        total = sum(todo.values())
        with (
            ThreadPoolExecutor(HASH_THREADS) as hashers,
            progress.task(f"pull {resolved.registered_model} v{resolved.version}", total) as bar,
        ):

            def hash_later(rel: str, path: Path) -> None:
                checks[rel] = hashers.submit(_problem, path, manifest.files[rel])

            try:
                store.download(todo, staging, hash_later, bar.advance)
            except FileNotFoundError as exc:  # stores raise it with the relative path
                raise _tampered(str(exc.args[0]), resolved, "missing from the store") from None
            problems = {rel: f.result() for rel, f in checks.items()}
        bad = {rel: problem for rel, problem in problems.items() if problem}
        if bad:
            for rel in bad:
                (staging / rel).unlink(missing_ok=True)
            rel, problem = next(iter(sorted(bad.items())))
            more = f"; {len(bad) - 1} more file(s) too" if len(bad) > 1 else ""
            raise _tampered(rel, resolved, problem + more)
        return cache.install(resolved.content_hash, staging)
