"""``quantgate seed``: serve this node's cached versions to its peers, at a bounded upload rate.

Every ``RESCAN_S`` the seeder compares its torrents with the cache: an entry installed since (a
pull put it there, with the torrent whose info-hash the signed approval named) is added, an
entry evicted or removed is dropped, so an evicted version stops being served within one
rescan. Entries are added in libtorrent's seed mode, which trusts nothing it has not checked:
each piece is hashed against its merkle tree the first time a peer asks for it, so a cached
file altered on disk is never served as the version (peers check every block anyway). The
signature the manifest was installed with is served from the install record.

The cache is what a pull installs into (``quantgate.publish.PullCache``), seen through the few
names ``SeedableCache`` lists: the fleet sits below publish and imports nothing of it.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any, Protocol

from quantgate.contracts.artifact import MANIFEST
from quantgate.fleet import torrent as torrents
from quantgate.fleet.node import Node, closed_flags
from quantgate.runtime.atomic import write_bytes

RESCAN_S = 2.0
SIGNATURE = "manifest.sig"


class SeedableCache(Protocol):
    """What the seeder reads of a pull cache: where its entries live, which are installed (named
    by their manifest's sha256), and each one's install record, torrent and signature paths."""

    root: Path

    def entries(self) -> list[tuple[float, int, str]]:
        """(last use, bytes, entry) of every installed entry."""

    def record(self, entry_id: str) -> dict[str, Any] | None:
        """The entry's install record (its ``signature`` among it), None when it has none."""

    def torrent_path(self, entry_id: str) -> Path:
        """Where the entry's torrent lies, beside its record."""

    def signature_path(self, entry_id: str) -> Path:
        """Where the seeder writes the entry's manifest signature to serve it."""


class Seeder:
    """The torrents of one cache's entries in one node's engine."""

    def __init__(self, node: Node, cache: SeedableCache) -> None:
        self.node, self.cache = node, cache
        self.handles: dict[str, object] = {}  # entry -> torrent handle

    def sync(self) -> set[str]:
        """Add the entries installed since the last call and drop those gone; the entries seeded."""
        installed = {name for _, _, name in self.cache.entries()}
        for entry in sorted(set(self.handles) - installed):
            with contextlib.suppress(RuntimeError):  # already gone from the engine
                self.node.session.remove_torrent(self.handles.pop(entry))
        for entry in sorted(installed - set(self.handles)):
            params = self._params(entry)
            if params is None:
                continue
            self.handles[entry] = self.node.session.add_torrent(params)
        for handle in self.handles.values():
            with contextlib.suppress(RuntimeError):  # removed by the engine since (an error)
                self.node.connect_peers(handle)
        self.node.session.pop_alerts()
        return set(self.handles)

    def _params(self, entry: str):
        """The add_torrent_params that seed ``entry`` from the cache, or None when it has no
        torrent (pulled from the origin alone, or by an older quantgate) or no valid record."""
        import libtorrent as lt

        record = self.cache.record(entry) or {}
        signature = record.get("signature")
        try:  # its signed part alone (an entry kept by an older quantgate may name trackers)
            data = self.cache.torrent_path(entry).read_bytes()
            found = torrents.load(data, torrents.info_hash(data), entry)
        except (OSError, ValueError):
            return None
        if not isinstance(signature, str) or MANIFEST not in found.files:
            return None
        params = lt.add_torrent_params()
        params.ti = found.info
        params.save_path = str(self.cache.root)
        params.flags |= lt.torrent_flags.seed_mode | closed_flags()
        params.flags &= ~(lt.torrent_flags.auto_managed | lt.torrent_flags.paused)
        if SIGNATURE in found.files:  # the signature lives in the install record, not the entry
            sig = self.cache.signature_path(entry)
            write_bytes(sig, signature.encode())
            params.renamed_files = {found.files[SIGNATURE][0]: str(sig)}
        return params


def seed(node: Node, cache: SeedableCache, stop: threading.Event, rescan_s: float = RESCAN_S) -> None:
    """Seed ``cache``'s installed entries until ``stop`` is set (a signal, or the caller)."""
    seeder = Seeder(node, cache)
    while not stop.is_set():
        with contextlib.suppress(OSError):
            seeder.sync()
        stop.wait(rescan_s)
