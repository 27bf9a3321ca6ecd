"""Any other artifact scheme MLflow understands (``mlflow-artifacts:`` proxied through the
tracking server, ``gs://``, ``wasbs://``, ...), through MLflow's artifact repository.

The fallback: these stores keep no checksum we can read, so verification downloads the
store's copy and re-hashes it, an upload sends every file again, and ``mlflow-artifacts:``
pulls go through the tracking server's proxy. For a fleet,
prefer ``s3://`` with ``--no-serve-artifacts`` (see artifacts_registry/README.md).
"""

from __future__ import annotations

import os
import posixpath
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from quantgate.publish.config import RegistryConfig
from quantgate.publish.store import Digest, OnBytes, OnFile
from quantgate.runtime.atomic import staged_dir
from quantgate.runtime.hashing import sha256_file


class MlflowStore:
    """An ``ArtifactStore`` through MLflow's artifact repository for ``uri``'s scheme."""

    def __init__(self, uri: str, cfg: RegistryConfig) -> None:
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

        self.uri = uri
        self.concurrency = cfg.transfer.concurrency
        self.repo = get_artifact_repository(
            uri, tracking_uri=cfg.tracking_uri, registry_uri=cfg.model_registry_uri
        )

    def digest(self, path: Path) -> Digest:
        """The file's sha256 and size (these stores keep no checksum we can read)."""
        entry = sha256_file(path)
        return Digest(entry.sha256, entry.bytes)

    def upload(self, files: dict[str, tuple[Path, Digest]], on_bytes: OnBytes) -> None:
        """Log every file: with no checksum to read, an intact copy in the store cannot be skipped."""
        for rel, (path, digest) in files.items():
            directory = posixpath.dirname(rel) or None
            if posixpath.basename(rel) != path.name:  # log_artifact keeps the local file's name
                raise ValueError(f"{rel}: the local file must be named {posixpath.basename(rel)}")
            self.repo.log_artifact(str(path), directory)
            on_bytes(digest.bytes)

    def _fetch(self, rel: str, dest: Path) -> Path:
        """Download one file into ``dest/rel`` through a temporary directory beside it."""
        target = dest / rel
        with staged_dir(target) as tmp:
            os.replace(self.repo.download_artifacts(rel, str(tmp)), target)
        return target

    def size(self, rel: str) -> int | None:
        """The file's size from a listing of its directory; None when it is not listed."""
        directory = posixpath.dirname(rel) or None
        for info in self.repo.list_artifacts(directory):
            if info.path == rel and not info.is_dir:
                return info.file_size
        return None

    def verify(self, expected: dict[str, Digest]) -> list[str]:
        """Download the store's copy of every file and re-hash it; one line per file that differs."""
        problems = []
        with tempfile.TemporaryDirectory(prefix="quantgate-verify-") as tmp:
            for rel, digest in expected.items():
                try:
                    entry = sha256_file(self._fetch(rel, Path(tmp)))
                except Exception as exc:  # noqa: BLE001  the repository raises its own types per scheme
                    problems.append(f"{rel}: cannot be read back from {self.uri} ({exc})")
                    continue
                if (entry.sha256, entry.bytes) != (digest.sha256, digest.bytes):
                    problems.append(f"{rel}: the store's copy differs from the local file")
        return problems

    def download(self, files: dict[str, int], dest: Path, on_file: OnFile, on_bytes: OnBytes) -> None:
        """Fetch the files in parallel (``transfer.concurrency``), each whole or not at all."""
        with ThreadPoolExecutor(self.concurrency) as pool:
            futures = {rel: pool.submit(self._fetch, rel, dest) for rel in files}
            for rel, future in futures.items():
                on_file(rel, future.result())
                on_bytes(files[rel])
