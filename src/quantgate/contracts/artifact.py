"""The artifact contract: what an artifact directory holds and what its ``manifest.json`` says.

The quantizer writes artifacts; evaluation, the gate, publish and pull read them through this
module, so no consumer re-parses loose dicts and a layout change is one edit every stage sees.
The manifest is an artifact's identity downstream: reuse (same build key, files intact), the
registry's lineage tags, the fleet's check at pull. The build key hashes every input that can
change the bytes but not the target's name: hopper-fp8 and rocm-cdna3-fp8 share a recipe, so
they share bytes and are built once.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import stat
from importlib import metadata
from pathlib import Path
from typing import Any

from pydantic import NonNegativeInt, ValidationError, field_validator

from quantgate.config import KVCache, Numerics
from quantgate.contracts.serving_table import ServingTable
from quantgate.runtime.errors import InputError, first_problem
from quantgate.runtime.frozen import FrozenRecord
from quantgate.runtime.hashing import FileEntry, file_problem, sha256_files
from quantgate.runtime.safe_path import path_problem
from quantgate.runtime.stat_cache import StatCache

MANIFEST = "manifest.json"
SCHEMA_VERSION = 1
# far above any real manifest (a 1,000-shard artifact's is about 200 kB); read no further
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
_TOOLS = ("quantgate", "torch", "transformers", "llmcompressor", "compressed-tensors", "safetensors")

# Files a serving engine needs beside the weights; an artifact carries the source's copies.
SUPPORT_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "chat_template.jinja",
    "generation_config.json",
    "vocab.json",
    "merges.txt",
)


class RecipeRef(FrozenRecord):
    """The recipe an artifact was built with, by name and by the sha256 of its file."""

    name: str
    sha256: str
    engine: str


class CalibrationRef(FrozenRecord):
    """The calibration set a calibrated recipe read (absent for data-free recipes)."""

    name: str
    sha256: str
    samples: NonNegativeInt
    max_seq_length: NonNegativeInt


class SourceRef(FrozenRecord):
    """The source checkpoint, as intake recorded it."""

    content_hash: str
    architecture: str
    params: NonNegativeInt
    model_class: str
    bytes: NonNegativeInt


class KVCalibrationInfo(FrozenRecord):
    """Who computed an artifact's FP8 KV scales and whether the same inputs give the same bytes on
    any machine: ``by`` "quantgate" (the data-free pass, ``quantize/canonical.py``: float64, canonical
    unless ``notes`` say why not) or the engine that calibrated them (its own arithmetic: not)."""

    by: str
    canonical: bool
    notes: tuple[str, ...] = ()


class BuildInfo(FrozenRecord):
    """How the build went: cost, and whether the bytes were linked from a twin target.

    ``peak_rss_bytes`` is None where the platform cannot measure it (no ``/proc``: off Linux).
    """

    seconds: float
    peak_rss_bytes: NonNegativeInt | None = None
    peak_rss_scope: str = "process high-water mark at the end of this build"
    finished_at: str
    linked_from: str | None = None
    # where calibration ran: "cpu" or "cuda" (None: built before builds recorded it)
    device: str | None = None
    # how the FP8 KV scales were computed (None: no FP8 KV cache, linked from a twin, or older)
    kv_calibration: KVCalibrationInfo | None = None


class RepairRef(FrozenRecord):
    """A repaired variant (``quantgate.repair``): which layer groups its uniform parent kept at the
    next precision up, so evaluation emulates each module in its own format and the registry's
    lineage tags name the repair."""

    parent_build_key: str  # the uniform artifact's build key: the variant's lineage
    upgrade: str  # the kept precision's label (FP8, bf16)
    units_total: NonNegativeInt  # layer groups the uniform artifact quantizes
    kept_units: list[str]  # layer groups kept, most sensitive first (a fused group is one unit)
    kept_modules: list[str]  # their modules on disk
    numerics: Numerics | None = None  # how kept modules compute; None: source precision (unquantized)


class Manifest(FrozenRecord):
    """``manifest.json``: what an artifact is, what it was built from, the hash of every file."""

    schema_version: int = SCHEMA_VERSION
    target: str
    hardware: str
    format: str
    kv_cache: KVCache
    numerics: Numerics
    recipe: RecipeRef
    calibration: CalibrationRef | None
    source: SourceRef
    tools: dict[str, str]
    build_key: str
    build: BuildInfo
    files: dict[str, FileEntry]
    # the serving check against the target's contract (None: built before the check existed)
    serving: ServingTable | None = None
    # support files (SUPPORT_FILES) copied from the source, by the sha256 of the source's bytes;
    # pull refuses an artifact whose file differs (None: built before they were restored)
    source_files: dict[str, str] | None = None
    # a repaired variant of the target's uniform artifact (None: the uniform recipe as written)
    repair: RepairRef | None = None

    @field_validator("files")
    @classmethod
    def _safe_names(cls, files: dict[str, FileEntry]) -> dict[str, FileEntry]:
        """Every name a normalized relative path (``safe_path``): consumers join them onto the
        artifact directory, and ``../x`` or ``/etc/x`` would leave it."""
        for name in files:
            if problem := path_problem(name):
                raise ValueError(f"file name {name!r} {problem}")
        return files

    @property
    def total_bytes(self) -> int:
        """Bytes on disk of every file the manifest names (the cold-start cost)."""
        return sum(f.bytes for f in self.files.values())


def tool_versions() -> dict[str, str]:
    """Versions of every tool that can change an artifact's bytes (part of its build key)."""
    versions = {"python": platform.python_version()}
    for name in _TOOLS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def build_key(
    *,
    source_hash: str,
    recipe_sha256: str,
    calibration_sha256: str | None,
    tools: dict[str, str],
    kv_cache: dict[str, Any] | None = None,
) -> str:
    """Content key of a build: equal keys promise equal bytes.

    ``kv_cache``: the FP8 KV decision and its scheme (``kv_calibration.key_part``); None for a bf16
    KV cache, which leaves the keys of builds without KV scales as they were.
    """
    parts: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "source": source_hash,
        "recipe": recipe_sha256,
        "calibration": calibration_sha256,
        "tools": tools,
    }
    if kv_cache is not None:
        parts["kv_cache"] = kv_cache
    payload = json.dumps(parts, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def hash_files(directory: Path) -> dict[str, FileEntry]:
    """sha256 and size of every file under ``directory`` except the manifest itself."""
    rels = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())
    return sha256_files(directory, [rel for rel in rels if rel != MANIFEST])


def write_manifest(directory: Path, manifest: Manifest) -> None:
    """Write ``directory/manifest.json``; call it last, once every file it names is in place."""
    (directory / MANIFEST).write_text(manifest.model_dump_json(indent=2) + "\n")


def read_manifest(directory: Path) -> Manifest | None:
    """The manifest of ``directory``, or None when it is absent or not a valid manifest
    (for callers to whom an invalid manifest means "not this artifact": reuse, caches)."""
    try:
        return load_manifest(directory)
    except InputError:
        return None


def require_manifest(directory: Path) -> Manifest:
    """The manifest of ``directory``; ``InputError`` naming the file and its first problem."""
    return load_manifest(directory)


def load_manifest(directory: Path) -> Manifest:
    """Read and validate ``directory/manifest.json``: the one place a manifest is checked.

    ``InputError`` (exit 2), one line naming the file and what is wrong with it: missing, not a
    regular file, over ``MAX_MANIFEST_BYTES``, not UTF-8 JSON (truncated, nested past the
    parser's depth limit), a field of the wrong type or missing, an unknown field, or a file name
    that is not a safe relative path. The file's content is never echoed.
    """
    path = Path(directory) / MANIFEST
    fix = "point at an artifact directory written by `quantgate build`, or rebuild it"
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # a FIFO would block the read, a device never end
            raise InputError(path, "not a regular file", fix)
        with open(path, "rb") as fh:
            data = fh.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        raise InputError(path, "missing (or a dangling link): not an artifact directory", fix) from None
    except OSError as exc:
        raise InputError(path, f"cannot be read ({exc.strerror or exc})", fix) from None
    if len(data) > MAX_MANIFEST_BYTES:
        raise InputError(path, f"larger than {MAX_MANIFEST_BYTES} bytes: not a manifest", fix)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(path, f"not UTF-8 text (byte {exc.start})", fix) from None
    try:
        return Manifest.model_validate_json(data)
    except ValidationError as exc:
        raise InputError(path, f"not a valid artifact manifest: {first_problem(exc)}", fix) from None


def verify_files(directory: Path, manifest: Manifest, cache: Path | None = None) -> list[str]:
    """Problems found comparing ``directory`` with its manifest; empty when intact.

    ``cache``: a stat cache directory (``quantgate.runtime.stat_cache``): a file unchanged since it last
    matched this manifest (by the build that wrote it, or an earlier verification) is not hashed
    again, and an intact directory's files are recorded for the next reader."""
    problems = []
    present = {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()} - {MANIFEST}
    for rel in sorted(present - set(manifest.files)):
        problems.append(f"{rel}: not in the manifest")
    seen = _stat_cache(directory, manifest, cache)
    hashed = 0
    for rel, entry in manifest.files.items():
        if seen is not None and seen.known.get(rel) == entry:
            continue
        hashed += 1
        if problem := file_problem(directory / rel, entry):
            problems.append(f"{rel}: {problem}")
    if seen is not None and hashed and not problems:  # nothing new to record when every file was known
        seen.save(dict(manifest.files))
    return problems


def record_verified(directory: Path, manifest: Manifest, cache: Path | None) -> None:
    """Record ``directory``'s files as matching ``manifest`` in the stat cache, without hashing: for
    the build that hashed them into the manifest in its own locked staging directory and then
    installed them (a rename keeps each file's device, inode and times)."""
    seen = _stat_cache(directory, manifest, cache)
    if seen is not None:
        seen.save(dict(manifest.files))


def _stat_cache(directory: Path, manifest: Manifest, cache: Path | None) -> StatCache | None:
    if cache is None:
        return None
    files = [rel for rel in manifest.files if (directory / rel).is_file()]
    return StatCache(cache / "verified", directory.resolve(), files)


def artifact_dirs(artifacts: Path, names: list[str] | None = None) -> list[Path]:
    """The artifact directories under ``artifacts`` (those holding a manifest), by name; InputError if none.

    Hidden directories are a build's temporary or replaced copies (``.<target>.tmp-*``, a killed
    build's included), never artifacts; a directory without ``manifest.json`` is not one either.
    ``names``: only these, each of which must be there. A chosen directory whose manifest is
    invalid is an error (``load_manifest``), not skipped: it looks like an artifact, and leaving
    it out silently would gate fewer than were built.
    """
    found = sorted(
        p
        for p in artifacts.iterdir()
        if p.is_dir() and not p.name.startswith(".") and os.path.lexists(p / MANIFEST)
    )
    if names:
        missing = sorted(set(names) - {p.name for p in found})
        if missing:
            raise InputError(
                artifacts,
                f"no artifact directory (with manifest.json) for {', '.join(missing)} here",
                f"build it with quantgate build --targets {','.join(missing)} --out {artifacts}, "
                "or leave it out of --targets",
            )
        found = [p for p in found if p.name in names]
    if not found:
        raise InputError(
            artifacts,
            "no artifact directories (with manifest.json) here",
            "run quantgate build --out DIR first",
        )
    for d in found:
        load_manifest(d)
    return found
