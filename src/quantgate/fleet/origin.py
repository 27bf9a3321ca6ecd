"""The origin as the swarm's last source: byte ranges of a version's files read from its store.

Why not libtorrent's own web seeds (BEP 19): a web seed is a plain URL per torrent, while an S3
store is read with signed requests (a presigned URL signs one object, and the seed appends each
file's path to the URL), and libtorrent asks a web seed for any piece it likes, including the
ones its peers already hold. So the node asks its store itself, with the client and credentials
every pull already uses, for a piece only when no connected peer has it, and hands the bytes to
libtorrent (``add_piece``), which checks them against the piece's merkle hashes like any
peer's. Stores that read ranges: S3 (a ranged GET) and a local directory; MLflow's artifact
repository cannot, so a version stored there is pulled as before, whole files from the origin.
The stores implement it (``quantgate.publish``'s ``read_range``); the fleet sees only this type.
"""

from __future__ import annotations

from collections.abc import Callable

RangeReader = Callable[[str, int, int], bytes]  # (file, offset, length) -> exactly those bytes
