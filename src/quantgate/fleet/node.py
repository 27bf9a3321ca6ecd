"""One node's BitTorrent engine (a libtorrent session), set up for a fleet fabric.

Settings and why: no DHT, local service discovery, UPnP or NAT-PMP (peers come from the
``peers`` setting alone, and nothing is announced outside the fleet); TCP only (uTP yields to
other traffic, which matters on a home link, not on a datacenter fabric); no protocol
encryption (RC4 obfuscation is not security: the bytes are verified by their merkle tree and
the signed manifest, not trusted for the link they came over); several connections per IP
(nodes on one host, or behind one NAT, are distinct peers); no choking (every peer is served at
once: there is no one to punish for not uploading); and the upload bound applies to
every peer: libtorrent exempts private and loopback addresses from rate limits by default, and
a fleet's fabric is exactly such addresses.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from quantgate.fleet.settings import FleetSettings, endpoints
from quantgate.units import MB

LISTEN_WAIT_S = 5.0
RECONNECT_S = 1.0  # a listed peer not connected is tried again this often


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
        "upload_rate_limit": int(fleet.upload_mb_s * MB),
        "alert_mask": int(
            lt.alert_category.error
            | lt.alert_category.status
            | lt.alert_category.storage
            | lt.alert_category.peer
            | lt.alert_category.piece_progress
        ),
        "user_agent": "quantgate",
    }


class Node:
    """A libtorrent session listening where the settings say (or, when that address is taken by
    this node's ``quantgate seed``, on a port of its own: it then only connects out)."""

    def __init__(self, fleet: FleetSettings) -> None:
        import libtorrent as lt

        self.fleet = fleet
        self.session = lt.session(_settings(fleet, fleet.listen))  # type: ignore[call-overload]
        everyone = lt.ip_filter()  # every address in the global class only: the upload bound holds
        everyone.add_rule("0.0.0.0", "255.255.255.255", 1 << self.session.global_peer_class_id)
        with contextlib.suppress(RuntimeError):  # no IPv6 on this host
            everyone.add_rule(
                "::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 1 << self.session.global_peer_class_id
            )
        self.session.set_peer_class_filter(everyone)
        if not self._listening():
            host = endpoints(fleet.listen)[0][0]
            self.session.apply_settings({"listen_interfaces": f"{host}:0"})
            self._listening()
        self._tried: dict[tuple[str, int], float] = {}

    def _listening(self) -> bool:
        import libtorrent as lt

        deadline = time.monotonic() + LISTEN_WAIT_S
        while time.monotonic() < deadline:
            self.session.wait_for_alert(100)
            for alert in self.session.pop_alerts():
                if isinstance(alert, lt.listen_succeeded_alert):
                    return True
                if isinstance(alert, lt.listen_failed_alert):
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
        """Ask every listed peer that is not connected yet (at most every ``RECONNECT_S``)."""
        connected = {(p.ip[0], p.ip[1]) for p in handle.get_peer_info()}
        now = time.monotonic()
        for peer in sorted(self.listed()):
            if peer in connected:
                continue
            if now - self._tried.get(peer, 0.0) >= RECONNECT_S:
                self._tried[peer] = now
                with contextlib.suppress(RuntimeError):
                    handle.connect_peer(peer)

    def close(self) -> None:
        """Stop the engine and wait until it has (its port is free again; nothing is written)."""
        del self.session  # the last reference: libtorrent's destructor waits for its threads


@contextlib.contextmanager
def node(fleet: FleetSettings) -> Iterator[Node]:
    """A ``Node`` for the duration of the block."""
    found = Node(fleet)
    try:
        yield found
    finally:
        found.close()
