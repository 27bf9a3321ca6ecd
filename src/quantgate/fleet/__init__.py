"""The fleet is the CDN: a version's bytes from the nodes that hold it, the origin last.

Built on libtorrent (BitTorrent v2). Publish makes each version's torrent (``torrent``) and the
gate's signed approval names its info-hash, so a node trusts a swarm only through the
registry's signature; ``pull`` fetches from the peers the ``peers`` setting lists (``settings``,
``node``), reads from the store only the pieces no peer has (``origin``), in the serving engine's
load order (``order``), and verifies every file against the signed manifest before it installs,
as it always did (``fetch``); ``seed`` serves the node's cached versions to its peers with a
bounded upload rate. The trust model and how a node joins: ``artifacts_registry/README.md``.
"""
