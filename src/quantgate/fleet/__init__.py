"""The fleet is the CDN: a version's bytes from the nodes that hold it, the origin last.

Built on libtorrent (BitTorrent v2). Publish makes each version's torrent (``torrent``) and the
gate's signed approval names its info-hash, so a node trusts a swarm only through the
registry's signature; ``pull`` fetches from the peers the ``peers`` setting lists (``settings``,
``node``), reads from the store only the pieces no peer has (``origin``), in the serving engine's
load order (``order``), and verifies every file against the signed manifest before it installs,
as it always did (``fetch``); peers are a speed-up, never a dependency: one that stalls is
dropped and a late piece is the origin's (``watch``); ``seed`` serves the node's cached versions
to its peers with a bounded upload rate. Nothing but the listed peers is contacted (``node``). The trust model and how a node joins: ``artifacts_registry/README.md``.

The fleet sits below publish (which makes and pulls versions through these names) and imports
nothing of it; its public names are those below (a name that is also a module's, ``node``,
``fetch``, ``seed``, is exported under another, since an imported submodule would shadow it).
"""

from typing import TYPE_CHECKING

from quantgate.runtime.exports import lazy_exports

if TYPE_CHECKING:
    from quantgate.fleet.fetch import METADATA_WAIT_S, NoTorrent, TorrentRefused
    from quantgate.fleet.fetch import fetch as fetch_version
    from quantgate.fleet.node import Node, check_listen
    from quantgate.fleet.node import node as open_node
    from quantgate.fleet.origin import RangeReader
    from quantgate.fleet.seed import SeedableCache, Seeder
    from quantgate.fleet.seed import seed as seed_cache
    from quantgate.fleet.settings import FleetSettings
    from quantgate.fleet.torrent import MAX_TORRENT_BYTES, TORRENT
    from quantgate.fleet.torrent import info_hash as torrent_info_hash
    from quantgate.fleet.torrent import load as load_torrent
    from quantgate.fleet.torrent import make as make_torrent

__all__ = [
    "MAX_TORRENT_BYTES",
    "METADATA_WAIT_S",
    "TORRENT",
    "FleetSettings",
    "NoTorrent",
    "Node",
    "RangeReader",
    "SeedableCache",
    "Seeder",
    "TorrentRefused",
    "check_listen",
    "fetch_version",
    "load_torrent",
    "make_torrent",
    "open_node",
    "seed_cache",
    "torrent_info_hash",
]
__getattr__ = lazy_exports(
    __name__,
    {
        "MAX_TORRENT_BYTES": "torrent",
        "METADATA_WAIT_S": "fetch",
        "NoTorrent": "fetch",
        "check_listen": "node",
        "TORRENT": "torrent",
        "FleetSettings": "settings",
        "Node": "node",
        "RangeReader": "origin",
        "SeedableCache": "seed",
        "Seeder": "seed",
        "TorrentRefused": "fetch",
        "fetch_version": "fetch:fetch",
        "load_torrent": "torrent:load",
        "make_torrent": "torrent:make",
        "open_node": "node:node",
        "seed_cache": "seed:seed",
        "torrent_info_hash": "torrent:info_hash",
    },
)
