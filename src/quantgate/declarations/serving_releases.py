"""The vLLM releases whose load-time rules quantgate reproduces.

Each was read from the release's own wheel (``pip download vllm==X --no-deps``), not from a
branch: 0.33.0 in full for the compressed-tensors paths; 0.23.0 and 0.24.0 for what changed
in the W4A16 kernels (Marlin pads N and K to its thread tiles from 0.24.0 on; 0.23.0 refuses a
partition whose N is not a multiple of 64 or K of 128). A contract may name only these: a
release nobody has read is a release whose rules quantgate would be guessing.
"""

from __future__ import annotations

RELEASES_READ = ("0.23.0", "0.24.0", "0.33.0")


def version_key(version: str) -> tuple[int, ...]:
    """``"0.24.0"`` -> ``(0, 24, 0)``: releases compare as tuples."""
    return tuple(int(part) for part in version.split("."))


def releases_from(min_version: str) -> list[str]:
    """The releases read that a fleet running ``min_version`` and newer may run: each is checked."""
    return [r for r in RELEASES_READ if version_key(r) >= version_key(min_version)]
