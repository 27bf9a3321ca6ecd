"""Artifact stores behind one small interface: where a version's bytes live.

Publish and pull see a store as a base URI plus relative paths (``artifact/<file>``,
``reports/report.json``) and four verbs: digest a local file, upload (skipping what is
already there intact where the store can tell, which makes a re-run resume), verify the
store's copy, download; and ``size``, so that a file can be refused by its size before a
byte of it is read (a manifest's signature, a gate report).
The scheme picks the implementation: ``s3://`` talks to S3 through boto3 directly (parallel,
multipart, with SHA-256 checksums the store keeps); a local path or ``file://`` copies; any
other scheme MLflow understands (``mlflow-artifacts:``, ``gs://``, ...) goes through MLflow's
own artifact repository, slower and verified by download (``stores.open_store`` picks it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

OnBytes = Callable[[int], None]
OnFile = Callable[[str, Path], None]


@dataclass(frozen=True)
class Digest:
    """A local file by content, plus the checksum the store will report for it (if any)."""

    sha256: str
    bytes: int
    store_check: str | None = None


class ArtifactStore(Protocol):
    """One store under a base URI: local directory, S3, or MLflow's artifact repository."""

    uri: str

    def digest(self, path: Path) -> Digest:
        """Hash a local file in one read: its sha256 and the store's own checksum of it."""

    def upload(self, files: dict[str, tuple[Path, Digest]], on_bytes: OnBytes) -> None:
        """Put ``files`` (relative path -> local file and digest) under the base URI; where the
        store can tell, a file already there with the same size and checksum is skipped."""

    def size(self, rel: str) -> int | None:
        """The stored file's size in bytes, None when it is not there (nothing is downloaded)."""

    def verify(self, expected: dict[str, Digest]) -> list[str]:
        """Problems with the store's copy of ``expected``; empty when every file is intact."""

    def download(self, files: dict[str, int], dest: Path, on_file: OnFile, on_bytes: OnBytes) -> None:
        """Fetch ``files`` (relative path -> bytes) into ``dest``; ``on_file(rel, path)`` runs
        as each one completes. A file appears under its final name only when whole."""


def join(uri: str, rel: str) -> str:
    """``rel`` under ``uri``, with one slash between."""
    return f"{uri.rstrip('/')}/{rel}"
