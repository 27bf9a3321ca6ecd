"""One node's BitTorrent engine (a libtorrent session), set up for a fleet fabric.

Settings and why: nothing is contacted but the listed peers (and the store, by the pull itself):
no DHT, local service discovery, UPnP or NAT-PMP, no peer exchange (the ``ut_pex`` plugin is not
loaded and every torrent carries ``disable_pex``: a listed peer's PEX message made a node dial an
address nobody listed), no trackers and no web seeds (the torrent handed to libtorrent holds only
its signed info dictionary: ``torrent.signed_part``); TCP only (uTP yields to other traffic, which
matters on a home link, not on a datacenter fabric); no protocol encryption (RC4 obfuscation is not
security: the bytes are verified by their merkle tree and the signed manifest, not trusted for the
link they came over); several connections per IP (nodes on one host, or behind one NAT, are
distinct peers); no choking (every peer is served at once: there is no one to punish for not
uploading); the upload bound applies to every peer (libtorrent exempts private and loopback
addresses from rate limits by default, and a fleet's fabric is exactly such addresses); and
short timeouts (a block not received in ``REQUEST_TIMEOUT_S`` is asked of another peer, a
handshake not finished in ``HANDSHAKE_TIMEOUT_S`` is dropped): the pull's own deadlines
(``watch``) then send what no peer delivers to the origin.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

from quantgate.fleet.settings import FleetSettings, endpoints
from quantgate.runtime.errors import UsageError
from quantgate.runtime.units import MB

LISTEN_WAIT_S = 5.0
RECONNECT_S = 1.0  # a listed peer not connected is tried again this often
REQUEST_TIMEOUT_S = 10  # libtorrent: a block not received this long is asked of another peer
HANDSHAKE_TIMEOUT_S = 5  # a peer that accepts the connection but never answers (a stopped process)
PEER_TIMEOUT_S = 30  # a connection with no message at all this long is closed
PLUGINS = ("ut_metadata", "smart_ban")  # a torrent by its info-hash; ban the sender of bad blocks


def _settings(fleet: FleetSettings, listen: str) -> dict:
    import libtorrent as lt

    return {
        "listen_interfaces": listen,
        "enable_dht": False,
        "enable_lsd": False,
        "enable_upnp": False,
        "enable_natpmp": False,
        "enable_outgoing_utp": False,
        "enable_incoming_utp": False,
        "out_enc_policy": int(lt.enc_policy.pe_disabled),
        "in_enc_policy": int(lt.enc_policy.pe_disabled),
        "allow_multiple_connections_per_ip": True,
        "unchoke_slots_limit": -1,  # every peer of the fleet is served, none waits for a slot
        "min_reconnect_time": 1,  # a peer that dropped (or restarted) is dialled again within a second
        "request_timeout": REQUEST_TIMEOUT_S,
        "piece_timeout": REQUEST_TIMEOUT_S,
        "handshake_timeout": HANDSHAKE_TIMEOUT_S,
        "peer_connect_timeout": HANDSHAKE_TIMEOUT_S,
        "peer_timeout": PEER_TIMEOUT_S,
        "upload_rate_limit": int(fleet.upload_mb_s * MB),
        "alert_mask": int(
            lt.alert_category.error
            | lt.alert_category.status
            | lt.alert_category.storage
            | lt.alert_category.peer
            | lt.alert_category.connect  # a refused dial: that listed peer has answered (fetch)
            | lt.alert_category.piece_progress
        ),
        "user_agent": "quantgate",
    }


class Node:
    """A libtorrent session listening where the settings say (or, when that address is taken by
    this node's ``quantgate seed``, on a port of its own: it then only connects out; with
    ``require_listen``, as ``quantgate seed`` asks, a UsageError naming the address instead)."""

    def __init__(self, fleet: FleetSettings, require_listen: bool = False) -> None:
        import libtorrent as lt

        self.fleet = fleet
        # no default plugins: ut_pex (peer exchange) is one of them
        self.session = lt.session(_settings(fleet, fleet.listen), 0)  # type: ignore[call-overload]
        for plugin in PLUGINS:
            self.session.add_extension(plugin)
        everyone = lt.ip_filter()  # every address in the global class only: the upload bound holds
        everyone.add_rule("0.0.0.0", "255.255.255.255", 1 << self.session.global_peer_class_id)
        with contextlib.suppress(RuntimeError):  # no IPv6 on this host
            everyone.add_rule(
                "::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 1 << self.session.global_peer_class_id
            )
        self.session.set_peer_class_filter(everyone)
        self.refused = lt.ip_filter()  # addresses of dropped peers (``drop``)
        self.dropped: set[tuple[str, int]] = set()
        if not self._listening():
            if require_listen:
                raise UsageError(
                    "QUANTGATE_FLEET_LISTEN",
                    f"cannot listen on {fleet.listen} ({self.listen_error or 'no answer'})",
                    LISTEN_FIX,
                )
            host = endpoints(fleet.listen)[0][0]
            self.session.apply_settings({"listen_interfaces": f"{host}:0"})
            if not self._listening():  # the host has no such address: any, to connect out
                self.session.apply_settings({"listen_interfaces": "0.0.0.0:0"})
                self._listening()
        self._tried: dict[tuple[str, int], float] = {}

    def _listening(self) -> bool:
        import libtorrent as lt

        self.listen_error = ""
        deadline = time.monotonic() + LISTEN_WAIT_S
        while time.monotonic() < deadline:
            self.session.wait_for_alert(100)
            for alert in self.session.pop_alerts():
                if isinstance(alert, lt.listen_succeeded_alert):
                    return True
                if isinstance(alert, lt.listen_failed_alert):
                    self.listen_error = alert.error.message()
                    return False
        return self.session.listen_port() != 0

    @property
    def port(self) -> int:
        """The port this node's engine listens on."""
        return int(self.session.listen_port())

    def listed(self) -> set[tuple[str, int]]:
        """The listed peers other than this node."""
        own = {
            ("127.0.0.1", self.port),
            ("localhost", self.port),
            (endpoints(self.fleet.listen)[0][0], self.port),
        }
        return set(self.fleet.peer_endpoints) - own

    def share(self) -> tuple[int, int]:
        """(this node's place, how many nodes) in the sorted list of the listed peers and itself:
        which pieces this node reads from the origin first."""
        own = (endpoints(self.fleet.listen)[0][0], self.port)
        everyone = sorted({*self.listed(), own})
        return everyone.index(own), len(everyone)

    def connect_peers(self, handle) -> None:
        """Ask every listed peer that is not connected yet (at most every ``RECONNECT_S``), except
        those dropped for stalling."""
        connected = {(p.ip[0], p.ip[1]) for p in handle.get_peer_info()}
        now = time.monotonic()
        for peer in sorted(self.listed() - self.dropped):
            if peer in connected:
                continue
            if now - self._tried.get(peer, 0.0) >= RECONNECT_S:
                self._tried[peer] = now
                with contextlib.suppress(RuntimeError):
                    handle.connect_peer(peer)

    def drop(self, peer: tuple[str, int]) -> bool:
        """Stop using ``peer`` (ip, port) for good: never dialled again, and its address refused by
        the engine (which closes its connections) when no other listed peer that is still in use
        shares that address. True when its connection was closed that way; nodes sharing one
        address (several on a host) stay connected until libtorrent's own timeouts close them,
        and the pull counts on them for nothing meanwhile (``watch``)."""
        self.dropped.add(peer)
        ip = peer[0]
        others = {_address(host) for host, port in self.listed() - self.dropped}
        if ip in others:
            return False
        with contextlib.suppress(RuntimeError, ValueError):  # not an address libtorrent can filter
            self.refused.add_rule(ip, ip, 1)  # 1: blocked
            self.session.set_ip_filter(self.refused)
            return True
        return False

    def close(self) -> None:
        """Stop the engine and wait until it has (its port is free again; nothing is written)."""
        del self.session  # the last reference: libtorrent's destructor waits for its threads


LISTEN_FIX = (
    "set QUANTGATE_FLEET_LISTEN (or fleet.listen in artifacts_registry/registry.yaml) to an address of "
    "this host and a free port, e.g. 0.0.0.0:6881"
)


def check_listen(fleet: FleetSettings) -> None:
    """UsageError (exit 2, before anything starts) when this host cannot listen where ``fleet.listen``
    says: an address it does not have, or a port taken. ``quantgate seed`` exists to be reached
    there; it used to print "seeding ... on port 0" and serve no one."""
    host, port = endpoints(fleet.listen)[0]
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise UsageError(
                "QUANTGATE_FLEET_LISTEN",
                f"cannot listen on {fleet.listen} ({exc.strerror or exc})",
                LISTEN_FIX,
            ) from None


def closed_flags():
    """The torrent flags that keep a swarm to the listed peers: no peer exchange, DHT or local
    service discovery for this torrent, whatever the session allows (every torrent a node adds)."""
    import libtorrent as lt

    return lt.torrent_flags.disable_pex | lt.torrent_flags.disable_dht | lt.torrent_flags.disable_lsd


def _address(host: str) -> str:
    """``host`` as the address peers are seen from (a name resolved once; itself if it cannot be)."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


@contextlib.contextmanager
def node(fleet: FleetSettings, require_listen: bool = False) -> Iterator[Node]:
    """A ``Node`` for the duration of the block."""
    found = Node(fleet, require_listen)
    try:
        yield found
    finally:
        found.close()
