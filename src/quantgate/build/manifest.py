"""``manifest.json``: what an artifact is, what it was built from, and the hash of every file.

The manifest is the artifact's identity for everything downstream: reuse (same build key,
files intact), the registry's lineage tags, and the fleet's verification at pull. The build
key hashes every input that can change the bytes (source, recipe file, calibration set, tool
versions), and deliberately not the target's name: hopper-fp8 and rocm-cdna3-fp8 share a
recipe and so share bytes, and are built once.
"""

from __future__ import annotations

import hashlib
import json
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from quantgate.hashing import FileEntry, file_problem, sha256_files

MANIFEST = "manifest.json"
SCHEMA_VERSION = 1
_TOOLS = ("quantgate", "torch", "transformers", "llmcompressor", "compressed-tensors", "safetensors")


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int = SCHEMA_VERSION
    target: str
    hardware: str
    format: str
    kv_cache: str
    numerics: dict[str, Any]
    recipe: dict[str, Any]  # name, sha256, engine
    calibration: dict[str, Any] | None  # name, sha256, samples; None for data-free recipes
    source: dict[str, Any]  # content_hash, architecture, params, model_class, bytes
    tools: dict[str, str]
    build_key: str
    build: dict[str, Any]  # seconds, peak_rss_bytes, finished_at, reused_bytes_from
    files: dict[str, FileEntry]

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.files.values())


def tool_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in _TOOLS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def build_key(*, source_hash: str, recipe_sha256: str, calibration_sha256: str | None, tools: dict[str, str]) -> str:
    payload = json.dumps(
        {
            "schema": SCHEMA_VERSION,
            "source": source_hash,
            "recipe": recipe_sha256,
            "calibration": calibration_sha256,
            "tools": tools,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def hash_files(directory: Path) -> dict[str, FileEntry]:
    """sha256 and size of every file under ``directory`` except the manifest itself."""
    rels = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())
    return sha256_files(directory, [rel for rel in rels if rel != MANIFEST])


def write_manifest(directory: Path, manifest: Manifest) -> None:
    (directory / MANIFEST).write_text(manifest.model_dump_json(indent=2) + "\n")


def read_manifest(directory: Path) -> Manifest | None:
    path = directory / MANIFEST
    if not path.exists():
        return None
    try:
        return Manifest.model_validate_json(path.read_text())
    except ValueError:
        return None


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
