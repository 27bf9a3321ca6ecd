"""Turn a checkpoint URI from a push (a local path or ``s3://bucket/prefix``) into a local directory.

Training pushes checkpoints to object storage; a deployment receives the URI. The download
goes into the cache under a key made of the objects' names, sizes and ETags, so a re-run on the
same push downloads nothing, and a new push to the same prefix (new ETags) is new work. The
copy is staged and renamed into place, so a killed download never looks like a checkpoint.
Intake then hashes the *content*, which is what every later cache key uses. Object names are
data, not paths: each one goes through ``safe_path`` before it names a file (a key with ``..``,
an absolute or unnormalized name is refused, exit 2, before anything is downloaded).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from urllib.parse import urlparse

from quantgate.runtime.atomic import install_dir, staged_dir
from quantgate.runtime.errors import InputError, TransientError
from quantgate.runtime.safe_path import safe_relpath


def local_checkpoint(uri: str, cache: Path) -> Path:
    """The local directory for ``uri``: itself when local, a cached download for ``s3://``."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        path = Path(parsed.path if parsed.scheme == "file" else uri).expanduser()
        if not path.is_dir():
            raise InputError(
                path, "checkpoint directory does not exist", "pass a directory or an s3://bucket/prefix URI"
            )
        return path
    if parsed.scheme == "s3":
        return _from_s3(parsed.netloc, parsed.path.lstrip("/"), cache / "checkpoints")
    raise InputError(
        uri, f"unsupported checkpoint URI scheme '{parsed.scheme}'", "use a local path or s3://bucket/prefix"
    )


def s3_client():
    """boto3 S3 client; endpoint from ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL`` (boto3 reads
    them) or ``MLFLOW_S3_ENDPOINT_URL`` (what an MLflow deployment already sets)."""
    import boto3

    endpoint = os.environ.get("MLFLOW_S3_ENDPOINT_URL")
    return boto3.client("s3", endpoint_url=endpoint) if endpoint else boto3.client("s3")


def _from_s3(bucket: str, prefix: str, cache: Path) -> Path:
    from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError

    prefix = prefix.rstrip("/") + "/" if prefix else ""
    client = s3_client()
    try:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        objects = [o for page in pages for o in page.get("Contents", []) if not o["Key"].endswith("/")]
    except EndpointConnectionError as exc:
        raise TransientError(f"s3://{bucket}/{prefix}: cannot reach the endpoint ({exc})") from exc
    except ClientError as exc:
        raise InputError(
            f"s3://{bucket}/{prefix}",
            f"cannot list the checkpoint ({exc})",
            "check the bucket, the prefix and the credentials in the environment",
        ) from exc
    if not objects:
        raise InputError(
            f"s3://{bucket}/{prefix}", "no objects under this prefix", "push the checkpoint there first"
        )
    identity = sorted((o["Key"][len(prefix) :], o["Size"], o.get("ETag", "")) for o in objects)
    for rel, _, _ in identity:
        safe_relpath(rel, f"s3://{bucket}/{prefix}{rel}")
    key = hashlib.sha256(repr((bucket, prefix, identity)).encode()).hexdigest()[:24]
    final = cache / key
    if final.is_dir():
        return final
    try:
        with staged_dir(final) as staging:
            for rel, _, _ in identity:
                dest = staging / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                client.download_file(bucket, prefix + rel, str(dest))
            install_dir(staging, final, replace=False)  # a concurrent download of the same objects may win
    except (BotoCoreError, ClientError) as exc:
        raise TransientError(f"s3://{bucket}/{prefix}: download failed ({exc})") from exc
    return final
