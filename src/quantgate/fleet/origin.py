"""The origin as the swarm's last source: byte ranges of a version's files read from its store.

Why not libtorrent's own web seeds (BEP 19): a web seed is a plain URL per torrent, while an S3
store is read with signed requests (a presigned URL signs one object, and the seed appends each
file's path to the URL), and libtorrent asks a web seed for any piece it likes, including the
ones its peers already hold. So the node asks its store itself, with the client and credentials
every pull already uses, for a piece only when no connected peer has it, and hands the bytes to
libtorrent (``add_piece``), which checks them against the piece's merkle hashes like any
peer's. Stores that read ranges: S3 (a ranged GET) and a local directory; MLflow's artifact
repository cannot, so a version stored there is pulled as before, whole files from the origin.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from quantgate.publish import ArtifactStore

RangeReader = Callable[[str, int, int], bytes]  # (file, offset, length) -> exactly those bytes


def range_reader(store: ArtifactStore) -> RangeReader | None:
    """A reader of byte ranges from ``store``, or None when the store cannot read ranges."""
    from quantgate.publish import LocalStore, S3Store, s3_errors

    if isinstance(store, S3Store):

        def from_s3(rel: str, offset: int, length: int) -> bytes:
            with s3_errors(store.uri):
                body = store.client.get_object(
                    Bucket=store.bucket, Key=store.key(rel), Range=f"bytes={offset}-{offset + length - 1}"
                )["Body"]
                data = body.read()
            if len(data) != length:
                raise OSError(f"{store.uri}/{rel}: {len(data)} bytes at {offset}, asked for {length}")
            return data

        return from_s3
    if isinstance(store, LocalStore):
        root = Path(store.root)

        def from_directory(rel: str, offset: int, length: int) -> bytes:
            with open(root / rel, "rb") as fh:
                fh.seek(offset)
                data = fh.read(length)
            if len(data) != length:
                raise OSError(f"{root / rel}: {len(data)} bytes at {offset}, asked for {length}")
            return data

        return from_directory
    return None
