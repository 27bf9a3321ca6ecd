"""The fleet's peer settings (``registry.yaml``'s ``fleet:``, or ``QUANTGATE_FLEET_*``).

Peer discovery is one setting, ``peers``: the ``host:port`` list of the fleet's nodes, as the
fleet's service discovery already knows it (a Kubernetes headless service, Consul, a static
inventory). Why not a tracker or a DHT: a tracker is one more service to run and keep up for
the fleet to start, and a DHT (or local service discovery, which is multicast) does not cross
the subnets of a fabric reliably and takes seconds to converge; the node list exists already and
is exact. Empty (the default) is today's behaviour: every byte from the origin.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, field_validator

_ENDPOINT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.\-]*):([0-9]{1,5})$")


def endpoints(text: str) -> list[tuple[str, int]]:
    """``host:port,host:port`` as (host, port) pairs; ValueError naming the first bad entry."""
    found = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        match = _ENDPOINT.match(item)
        if match is None or not 0 < int(match.group(2)) < 65536:
            raise ValueError(f"{item!r} is not host:port")
        found.append((match.group(1).strip("[]"), int(match.group(2))))
    return found


class FleetSettings(BaseModel):
    """How a node finds its peers, where it listens, and what it gives them."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    # the fleet's nodes, host:port comma-separated (service discovery's list); empty: origin only
    peers: str = ""
    # where this node's BitTorrent engine listens for its peers (pull and seed)
    listen: str = "0.0.0.0:6881"
    # upload bound per node, MB/s (SI), for pulls and `quantgate seed` alike
    upload_mb_s: PositiveFloat = Field(default=200.0, le=1e6)
    # no byte from peers or the origin for this long: the pull stops (exit 75, it resumes)
    stall_s: PositiveFloat = Field(default=60.0, le=86400)

    @field_validator("peers")
    @classmethod
    def _peers(cls, value: str) -> str:
        endpoints(value)
        return value

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        if len(endpoints(value)) != 1:
            raise ValueError("listen is one host:port")
        return value

    @property
    def peer_endpoints(self) -> list[tuple[str, int]]:
        """``peers`` as (host, port) pairs."""
        return endpoints(self.peers)
