"""The fleet under peers and stores that misbehave (issue 44): a peer that stalls is a deadline,
never the pull; only the torrent's signed part is used and nothing outside the listed peers and
the store is contacted; a full disk in a peer pull is exit 75; a store that lost its torrent is
still the origin. A real SQLite MLflow registry and a local store (conftest), peers written by
hand (support.fleet.RawPeer), a listener counting every connection and HTTP request."""

from __future__ import annotations

import filecmp
import time

import libtorrent as lt
import pytest

from quantgate.fleet import TORRENT, FleetSettings, Seeder, open_node
from quantgate.publish import pull
from quantgate.publish.cache import PullCache
from quantgate.publish.local_store import local_path
from quantgate.runtime.errors import DiskFullError
from support.artifacts import MODEL
from support.fleet import Listener, RawPeer
from support.servers import free_port
from support.tmpfs import files_under, small_tmpfs

pytestmark = [pytest.mark.unit, pytest.mark.heavy]

STALL_S = 20  # the pull's own no-byte limit: a silent seed used to end the pull here (exit 75)
FILES = ("model.safetensors", "config.json", "sub/tokenizer.json")


def _fleet(registry, *peers: int):
    fleet = FleetSettings(
        peers=",".join(f"127.0.0.1:{p}" for p in peers), listen=f"127.0.0.1:{free_port()}", stall_s=STALL_S
    )
    return registry.model_copy(update={"fleet": fleet})


def _same(artifacts, path) -> bool:
    return all(filecmp.cmp(artifacts / "hopper-fp8" / rel, path / rel, shallow=False) for rel in FILES)


def _record(registry, path) -> dict:
    return PullCache(path.parent, registry.cache_max_bytes).record(path.name) or {}


def test_a_silent_seed_costs_a_deadline_not_the_pull(published, registry, artifacts, pull_cache):
    silent = RawPeer("silent")  # handshakes as a seed (HAVE_ALL, UNCHOKE), then never sends
    try:
        started = time.monotonic()
        path = pull(MODEL, "hopper-fp8", "chat", _fleet(registry, silent.port), cache_dir=pull_cache)
        seconds = time.monotonic() - started
    finally:
        silent.close()
    assert silent.requests > 0  # it was asked for blocks, and the pull did not wait on it
    assert seconds < STALL_S  # a hang guard: before the deadlines this was exit 75 at STALL_S
    assert _same(artifacts, path)
    record = _record(registry, path)
    assert int(record["peer_bytes"]) == 0 and int(record["stalled_peers"]) == 1


def test_the_store_lost_its_torrent_and_no_peer_sends_it_the_origin_serves(
    published, registry, artifacts, pull_cache
):
    (local_path(published.source) / TORRENT).unlink()
    silent = RawPeer("silent")
    try:
        path = pull(
            MODEL, "hopper-fp8", "chat", _fleet(registry, silent.port, free_port()), cache_dir=pull_cache
        )
    finally:
        silent.close()
    assert _same(artifacts, path)  # every file from the store, after the peers' grace


def _torrent_with_extras(published, tracker: Listener) -> bytes:
    """The store's torrent with a tracker, a web seed, DHT nodes and a big comment added outside
    the info dictionary (the signed info-hash unchanged)."""
    path = local_path(published.source) / TORRENT
    decoded = lt.bdecode(path.read_bytes())
    decoded[b"announce"] = f"{tracker.url}/announce".encode()
    decoded[b"announce-list"] = [[f"{tracker.url}/announce2".encode()]]
    decoded[b"url-list"] = [f"{tracker.url}/seed/".encode()]
    decoded[b"httpseeds"] = [f"{tracker.url}/httpseed".encode()]
    decoded[b"nodes"] = [[b"127.0.0.1", tracker.port]]
    decoded[b"comment"] = b"x" * 2_000_000
    data = bytes(lt.bencode(decoded))
    path.write_bytes(data)
    return data


def test_nothing_outside_the_listed_peers_and_the_store_is_contacted(
    published, registry, artifacts, pull_cache
):
    tracker, unlisted = Listener(), Listener()
    _torrent_with_extras(published, tracker)
    gossip = RawPeer("pex", pex_to=("127.0.0.1", unlisted.port))  # a listed peer naming an unlisted one
    try:
        path = pull(MODEL, "hopper-fp8", "chat", _fleet(registry, gossip.port), cache_dir=pull_cache)
        time.sleep(2)  # a dial or announce made late would show here (libtorrent acts on its 1 s tick)
    finally:
        gossip.close()
        tracker.close()
        unlisted.close()
    assert gossip.pex_sent  # the node speaks the extension protocol; PEX was offered to it
    assert (tracker.connections, unlisted.connections) == (0, 0), tracker.first_bytes + unlisted.first_bytes
    assert _same(artifacts, path)
    kept = lt.bdecode(PullCache(path.parent, 10**12).torrent_path(path.name).read_bytes())
    assert set(kept) == {b"info", b"piece layers"}  # the node keeps the signed part alone


def test_the_seeder_announces_nowhere_even_for_an_entry_kept_with_trackers(published, registry, pull_cache):
    tracker = Listener()
    cfg = _fleet(registry, free_port())
    path = pull(MODEL, "hopper-fp8", "chat", cfg, cache_dir=pull_cache)
    cache = PullCache(pull_cache / "pull", cfg.cache_max_bytes)
    cache.keep_torrent(path.name, _torrent_with_extras(published, tracker))  # as an older quantgate kept it
    try:
        with open_node(cfg.fleet) as own:
            seeder = Seeder(own, cache)
            deadline = time.monotonic() + 3  # libtorrent announces on adding a torrent, then each tick
            while time.monotonic() < deadline:
                assert seeder.sync() == {path.name}
                time.sleep(0.2)
    finally:
        tracker.close()
    assert tracker.connections == 0, tracker.first_bytes


def test_a_full_disk_in_a_peer_pull_is_exit_75_with_staging_dropped(published, registry, tmp_path):
    # a peer listed (none answers): the fleet path, every piece from the origin through libtorrent
    with small_tmpfs(tmp_path / "small", 200) as small:  # the artifact is 300 kB
        with pytest.raises(DiskFullError, match="no space left") as err:
            pull(MODEL, "hopper-fp8", "chat", _fleet(registry, free_port()), cache_dir=small)
        left = files_under(small / "pull")
    assert err.value.exit_code == 75
    assert "\n" not in str(err.value)
    # nothing installed, nothing staged (only lock files, the remembered resolution and the
    # node's ledger of release records stay)
    assert [f for f in left if not f.endswith(".lock") and f not in ("index.json", "releases.json")] == []
