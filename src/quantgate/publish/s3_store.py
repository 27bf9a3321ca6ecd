"""S3 (or any S3-compatible endpoint) through boto3 directly.

Why not MLflow's own S3 artifact repository: it uploads and downloads file by file with no
checksums kept in the store, so the only way to verify an upload would be to download it
again. Here every object is uploaded with ``ChecksumAlgorithm=SHA256``: S3 validates each
part on receipt and keeps the checksum, so verifying the store's copy costs one HEAD per
file. For a single-part object that checksum *is* the manifest's sha256; for a multipart one
it is S3's composite (sha256 over the parts' sha256s), which ``digest`` computes in the same
read that hashes the whole file. Transfers go through s3transfer's ``TransferManager``:
files in parallel, large files in ranged parts.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

from quantgate.publish.config import RegistryConfig
from quantgate.publish.store import Digest, OnBytes, OnFile
from quantgate.runtime.errors import RegistryRefusedError, RegistryUnavailableError
from quantgate.runtime.hashing import CHUNK_BYTES
from quantgate.runtime.units import MB


def make_client(cfg: RegistryConfig):
    """One boto3 S3 client (thread-safe) with a connection pool sized for the transfers.

    Endpoint from the config (``MLFLOW_S3_ENDPOINT_URL``) or boto3's own environment;
    credentials from boto3's usual chain. Retries are botocore's "standard" mode, each request
    tried at most ``transfer.max_attempts`` times in all (botocore's ``total_max_attempts``; its
    ``max_attempts`` would count retries only). Tests wrap this function to inject S3 faults.
    """
    import boto3
    from botocore.config import Config

    t = cfg.transfer
    return boto3.session.Session().client(
        "s3",
        endpoint_url=cfg.s3_endpoint_url,
        config=Config(
            max_pool_connections=max(10, 2 * t.concurrency),
            retries={"total_max_attempts": t.max_attempts, "mode": "standard"},
            connect_timeout=t.connect_timeout_s,
            read_timeout=t.read_timeout_s,
        ),
    )


# Refusals that mean the bytes were damaged on the way, not that the request was wrong: S3
# rejects a body whose checksum, payload hash or length differs from what the client declared,
# and a multipart upload whose parts did not arrive as sent (s3transfer sends every part but
# the last at 5 MiB or more, so a part "too small" lost bytes in transit). Sending the file
# again is the fix, so they are transient, never a configuration error.
DAMAGED_IN_TRANSIT = {
    "BadDigest",
    "XAmzContentSHA256Mismatch",
    "IncompleteBody",
    "InvalidChunkSizeError",
    "EntityTooSmall",
    "InvalidPart",
}


@contextlib.contextmanager
def s3_errors(uri: str) -> Iterator[None]:
    """S3 failures as typed errors: a missing object is ``FileNotFoundError`` (callers name
    the file), a refusal (credentials, permissions, bucket) is a configuration error, and an
    unreachable or failing endpoint is transient (retry; uploads and pulls resume)."""
    from botocore.exceptions import BotoCoreError, ClientError
    from s3transfer.exceptions import RetriesExceededError

    try:
        yield
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if code in ("404", "NoSuchKey"):
            raise FileNotFoundError(str(exc)) from exc
        if status >= 500 or code in ("SlowDown", "RequestTimeout", "Throttling", *DAMAGED_IN_TRANSIT):
            raise RegistryUnavailableError(
                uri, f"the S3 store failed ({code or status})", "retry; the transfer resumes where it stopped"
            ) from exc
        raise RegistryRefusedError(
            uri,
            f"the S3 store refused the request ({code or exc})",
            "check the bucket exists and MLFLOW_S3_ENDPOINT_URL and the AWS_* credentials are right",
        ) from exc
    except BotoCoreError as exc:
        raise RegistryUnavailableError(
            uri,
            f"the S3 store cannot be reached ({exc})",
            "check MLFLOW_S3_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3) and the AWS_* credentials; retry",
        ) from exc
    except RetriesExceededError as exc:  # s3transfer's own download retries (bodies cut short)
        raise RegistryUnavailableError(
            uri,
            f"downloads from the S3 store kept failing ({exc.last_exception})",
            "retry; files already verified are kept and the pull resumes",
        ) from exc


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


class _Subscriber:
    """s3transfer progress callbacks, forwarded to a progress handle."""

    def __init__(self, on_bytes: OnBytes) -> None:
        from s3transfer.subscribers import BaseSubscriber

        class _Sub(BaseSubscriber):
            def on_progress(self, future, bytes_transferred, **kwargs):
                on_bytes(bytes_transferred)

        self.instance = _Sub()


class S3Store:
    """An ``ArtifactStore`` on ``s3://bucket/prefix``, transfers through s3transfer."""

    def __init__(self, uri: str, cfg: RegistryConfig) -> None:
        from boto3.s3.transfer import TransferConfig

        parsed = urlparse(uri)
        self.uri = uri
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        self.client = make_client(cfg)
        t = cfg.transfer
        self.max_attempts = t.max_attempts
        self.config = TransferConfig(
            multipart_threshold=t.multipart_threshold_mb * MB,
            multipart_chunksize=t.multipart_chunksize_mb * MB,
            max_concurrency=t.concurrency,
            num_download_attempts=t.max_attempts,  # s3transfer's own retries of bodies cut short
        )

    def key(self, rel: str) -> str:
        """The object key of ``rel`` under the prefix."""
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def read_range(self, rel: str, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes of ``rel`` from ``offset``, one ranged GET (the fleet's origin
        reads)."""
        with s3_errors(self.uri):
            body = self.client.get_object(
                Bucket=self.bucket, Key=self.key(rel), Range=f"bytes={offset}-{offset + length - 1}"
            )["Body"]
            data = body.read()
        if len(data) != length:
            raise OSError(f"{self.uri}/{rel}: {len(data)} bytes at {offset}, asked for {length}")
        return data

    def _part_size(self, size: int) -> int | None:
        """The part size s3transfer will use for ``size`` bytes; None for a single PUT."""
        from s3transfer.utils import ChunksizeAdjuster

        if size < self.config.multipart_threshold:
            return None
        return ChunksizeAdjuster().adjust_chunksize(self.config.multipart_chunksize, size)

    def digest(self, path: Path) -> Digest:
        """In one read: the file's sha256 and the SHA-256 checksum S3 will keep for it (whole, or
        composite over the parts s3transfer will upload)."""
        size = path.stat().st_size
        part = self._part_size(size)
        whole = hashlib.sha256()
        parts: list[bytes] = []
        current, in_part = hashlib.sha256(), 0
        with open(path, "rb") as fh:
            while chunk := fh.read(CHUNK_BYTES):
                whole.update(chunk)
                if part:  # a read may straddle a part boundary: split it there
                    view = memoryview(chunk)
                    while view:
                        take = min(len(view), part - in_part)
                        current.update(view[:take])
                        in_part += take
                        view = view[take:]
                        if in_part == part:
                            parts.append(current.digest())
                            current, in_part = hashlib.sha256(), 0
        if part and in_part:
            parts.append(current.digest())
        check = _b64(hashlib.sha256(b"".join(parts)).digest()) if part else _b64(whole.digest())
        return Digest(whole.hexdigest(), size, check)

    def _stored_check(self, rel: str) -> tuple[int, str | None] | None:
        """(size, SHA-256 checksum without S3's ``-<parts>`` suffix) of one object, or None."""
        try:
            with s3_errors(self.uri):
                head = self.client.head_object(Bucket=self.bucket, Key=self.key(rel), ChecksumMode="ENABLED")
        except FileNotFoundError:
            return None
        check = head.get("ChecksumSHA256")
        return head["ContentLength"], check.split("-")[0] if check else None

    def _intact(self, rel: str, digest: Digest) -> bool:
        return self._stored_check(rel) == (digest.bytes, digest.store_check)

    def size(self, rel: str) -> int | None:
        """The object's size from one HEAD; None when there is no such object."""
        found = self._stored_check(rel)
        return found[0] if found is not None else None

    def upload(self, files: dict[str, tuple[Path, Digest]], on_bytes: OnBytes) -> None:
        """Upload, with SHA-256 checksums, every file whose object is not already there intact.

        A file whose stored copy does not match once its upload returns (its body cut short or
        damaged on the way: S3 refuses most such bodies, a proxy or a lenient store may keep
        them) is sent again, at most ``transfer.max_attempts`` times in all; after that the
        store is failing, which is transient (exit 75): nothing is registered, and a re-run
        sends only what is still not intact.
        """
        todo = {}
        for rel, (path, digest) in files.items():
            if self._intact(rel, digest):
                on_bytes(digest.bytes)  # already there intact: a re-run resumes here
            else:
                todo[rel] = path
        for _ in range(self.max_attempts):
            refused = self._transfer(todo, on_bytes)
            todo = {
                rel: path
                for rel, path in todo.items()
                if rel in refused or not self._intact(rel, files[rel][1])
            }
            if not todo:
                return
        rel = min(todo)
        more = f" (and {len(todo) - 1} more files)" if len(todo) > 1 else ""
        raise RegistryUnavailableError(
            self.uri,
            f"{rel}{more} arrived damaged in the S3 store {self.max_attempts} times in a row "
            f"({refused.get(rel, 'size or SHA-256 checksum differs')})",
            "retry; files already stored intact are not sent again",
        )

    def _transfer(self, todo: dict[str, Path], on_bytes: OnBytes) -> dict[str, str]:
        """One parallel upload of ``todo``; returns the files S3 refused as damaged in transit
        (with the store's error code); any other failure raises as ``s3_errors`` types it."""
        from boto3.s3.transfer import create_transfer_manager
        from botocore.exceptions import ClientError

        refused = {}
        with s3_errors(self.uri), create_transfer_manager(self.client, self.config) as manager:
            futures = {
                rel: manager.upload(
                    str(path),
                    self.bucket,
                    self.key(rel),
                    extra_args={"ChecksumAlgorithm": "SHA256"},
                    subscribers=[_Subscriber(on_bytes).instance],
                )
                for rel, path in todo.items()
            }
            for rel, future in futures.items():
                try:
                    future.result()
                except ClientError as exc:
                    code = exc.response.get("Error", {}).get("Code", "")
                    if code not in DAMAGED_IN_TRANSIT:
                        raise
                    refused[rel] = code
        return refused

    def verify(self, expected: dict[str, Digest]) -> list[str]:
        """One HEAD per file: size and stored checksum against the local digest."""
        problems = []
        for rel, digest in expected.items():
            stored = self._stored_check(rel)
            if stored is None:
                problems.append(f"{rel}: missing from {self.uri}")
            elif stored[0] != digest.bytes:
                problems.append(f"{rel}: {stored[0]} bytes in the store, expected {digest.bytes}")
            elif stored[1] != digest.store_check:
                problems.append(f"{rel}: the store's SHA-256 checksum differs from the local file's")
        return problems

    def download(self, files: dict[str, int], dest: Path, on_file: OnFile, on_bytes: OnBytes) -> None:
        """Download the files in parallel; FileNotFoundError(rel) for a missing object."""
        from boto3.s3.transfer import create_transfer_manager

        with s3_errors(self.uri), create_transfer_manager(self.client, self.config) as manager:
            futures = []
            for rel in files:
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                # s3transfer writes to a temporary name and renames when the object is whole
                futures.append(
                    (
                        rel,
                        manager.download(
                            self.bucket,
                            self.key(rel),
                            str(dest / rel),
                            subscribers=[_Subscriber(on_bytes).instance],
                        ),
                    )
                )
            for rel, future in futures:
                try:
                    with s3_errors(self.uri):
                        future.result()
                except FileNotFoundError:
                    raise FileNotFoundError(rel) from None
                on_file(rel, dest / rel)
