"""``quantgate seed``: serve this node's cached versions to its fleet peers (``quantgate.fleet``).

Runs until SIGTERM or SIGINT, upload bounded by ``QUANTGATE_FLEET_UPLOAD_MB_S``; an entry
installed by a pull is served within a rescan, an evicted one dropped.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

from quantgate.cli.options import CacheOpt, RootOpt
from quantgate.config import cache_dir, project_root


def serve(cache: Path, root: Path | None) -> None:
    """Seed the pull cache under ``cache`` until a signal (pull's ``--seed`` ends here too)."""
    from quantgate.fleet import check_listen, open_node, seed_cache
    from quantgate.publish import PullCache, RegistryConfig

    cfg = RegistryConfig.from_env((root or project_root()).resolve())
    check_listen(cfg.fleet)  # a seeder nobody can reach is a usage error, not a quiet "port 0"
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with open_node(cfg.fleet, require_listen=True) as own:
        print(
            f"seeding {cache / 'pull'} on port {own.port} to {len(own.listed())} listed peer(s), "
            f"at most {cfg.fleet.upload_mb_s:g} MB/s",
            file=sys.stderr,
        )
        seed_cache(own, PullCache(cache / "pull", cfg.cache_max_bytes), stop)


def seed(cache: CacheOpt = None, root: RootOpt = None) -> None:
    """Serve this node's cached versions to the peers QUANTGATE_FLEET_PEERS lists, until stopped."""
    serve((cache or cache_dir()).resolve(), root)
