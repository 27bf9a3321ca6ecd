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
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, NonNegativeInt

from quantgate.config.targets import KVCache, Numerics
from quantgate.errors import InputError
from quantgate.hashing import FileEntry, file_problem, sha256_files
from quantgate.serving.table import ServingTable

MANIFEST = "manifest.json"
SCHEMA_VERSION = 1
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


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RecipeRef(_Part):
    """The recipe an artifact was built with, by name and by the sha256 of its file."""

    name: str
    sha256: str
    engine: str


class CalibrationRef(_Part):
    """The calibration set a calibrated recipe read (absent for data-free recipes)."""

    name: str
    sha256: str
    samples: NonNegativeInt
    max_seq_length: NonNegativeInt


class SourceRef(_Part):
    """The source checkpoint, as intake recorded it."""

    content_hash: str
    architecture: str
    params: NonNegativeInt
    model_class: str
    bytes: NonNegativeInt


class BuildInfo(_Part):
    """How the build went: cost, and whether the bytes were linked from a twin target.

    ``peak_rss_bytes`` is None where the platform cannot measure it (no ``/proc``: off Linux).
    """

    seconds: float
    peak_rss_bytes: NonNegativeInt | None = None
    peak_rss_scope: str = "process high-water mark at the end of this build"
    finished_at: str
    linked_from: str | None = None


class Manifest(_Part):
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
    """The manifest of ``directory``, or None when it is absent or not a valid manifest."""
    path = directory / MANIFEST
    if not path.exists():
        return None
    try:
        return Manifest.model_validate_json(path.read_text())
    except ValueError:
        return None


def require_manifest(directory: Path) -> Manifest:
    """The manifest of ``directory``; ``InputError`` naming the file when absent or invalid."""
    manifest = read_manifest(directory)
    if manifest is None:
        raise InputError(
            directory / MANIFEST,
            "missing or not a valid artifact manifest",
            "point at an artifact directory written by `quantgate build`, or rebuild it",
        )
    return manifest


def verify_files(directory: Path, manifest: Manifest) -> list[str]:
    """Problems found comparing ``directory`` with its manifest; empty when intact."""
    problems = []
    present = {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()} - {MANIFEST}
    for rel in sorted(present - set(manifest.files)):
        problems.append(f"{rel}: not in the manifest")
    for rel, entry in manifest.files.items():
        if problem := file_problem(directory / rel, entry):
            problems.append(f"{rel}: {problem}")
    return problems


def artifact_dirs(artifacts: Path) -> list[Path]:
    """The artifact directories under ``artifacts`` (those holding a manifest), by name; InputError if none.

    Hidden directories are a build's temporary or replaced copies, never artifacts.
    """
    found = sorted(
        p
        for p in artifacts.iterdir()
        if p.is_dir() and not p.name.startswith(".") and (p / MANIFEST).exists()
    )
    if not found:
        raise InputError(
            artifacts,
            "no artifact directories (with manifest.json) here",
            "run quantgate build --out DIR first",
        )
    return found
