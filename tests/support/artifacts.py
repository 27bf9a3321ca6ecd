"""Artifact directories and gate reports of the shapes quantgate writes, for publish and pull tests.

Builders, not fixtures, so that tests and benchmarks can make as many as they need, each with
a real manifest over its files (publish verifies them as it would a build's).
"""

from __future__ import annotations

import json
from pathlib import Path

from quantgate.contracts.artifact import Manifest, hash_files, tool_versions, write_manifest

MODEL = "tiny-model"


def write_artifact(directory: Path, target: str, files: dict[str, bytes]) -> Path:
    """An artifact directory as quantgate build lays it out: files plus a manifest of them."""
    directory.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        (directory / rel).parent.mkdir(parents=True, exist_ok=True)
        (directory / rel).write_bytes(data)
    return write_synthetic_manifest(directory, target)


def write_synthetic_manifest(directory: Path, target: str) -> Path:
    """A manifest over the files already in ``directory`` (a build's fields, made up), for
    artifacts whose files are written another way (the pull benchmark streams its shards)."""
    manifest = Manifest(
        target=target,
        hardware="test",
        format="float-quantized",
        kv_cache="fp8_e4m3",
        numerics={"weights": "fp8_e4m3fn", "activations": "fp8_e4m3fn_per_token", "native_on": ["hopper"]},
        recipe={"name": "fp8-dynamic", "sha256": "ab" * 32, "engine": "model_free"},
        calibration=None,
        source={
            "content_hash": "cd" * 32,
            "architecture": "LlamaForCausalLM",
            "params": 1000,
            "model_class": "dense",
            "bytes": 2000,
        },
        tools=tool_versions(),
        build_key="ef" * 32,
        build={"seconds": 0.1, "peak_rss_bytes": 1, "finished_at": "2026-11-30T00:00:00+00:00"},
        files=hash_files(directory),
    )
    write_manifest(directory, manifest)
    return directory


def write_report(
    directory: Path,
    approvals: dict[str, list[str]],
    *,
    tenants=("chat", "code"),
    exit_code=0,
    model: str = MODEL,
) -> Path:
    """A minimal report.json of the shape quantgate gate writes (the gate is tested elsewhere):
    ``approvals`` maps an artifact to the tenants it passed; it failed the other ``tenants``."""
    directory.mkdir(parents=True, exist_ok=True)
    verdicts = [
        {"artifact": a, "tenant": t, "verdict": "pass" if t in ok else "fail", "reasons": []}
        for a, ok in approvals.items()
        for t in tenants
    ]
    report = {
        "schema_version": 1,
        "model": model,
        "model_class": "dense",
        "source_hash": "cd" * 32,
        "approvals": approvals,
        "verdicts": verdicts,
        "exit_code": exit_code,
        "metrics": {a: {"wikitext": {"perplexity": 10.5, "kld_mean": 0.01, "note": None}} for a in approvals},
    }
    (directory / "report.json").write_text(json.dumps(report))
    (directory / "report.md").write_text("# report\n")
    return directory / "report.json"


def installed_entries(pull_cache: Path) -> list[str]:
    """The entries a pull cache holds (its hidden staging and lock files left out)."""
    root = pull_cache / "pull"
    if not root.exists():
        return []
    return sorted(p.name for p in root.iterdir() if not p.name.startswith(".") and p.is_dir())
