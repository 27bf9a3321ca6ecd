"""Deadlines on peers: which are delivering what they were asked, and which asked-for pieces are late.

Why: peers are a speed-up, never a dependency (issue 44). A peer that handshakes as a seed and
then sends nothing (a frozen process, a partition without RST, a hostile node) used to make the
pull wait for it: while any connected peer claimed a piece, the origin was never asked for it,
and the pull ended in exit 75 after ``stall_s`` with the origin up. Two deadlines now bound what
a peer can cost:

- **a peer**: one we want something from (it holds a piece we lack, and it chokes us or has our
  requests) that has sent no payload for ``PEER_DEADLINE_S`` is *stalled*: it no longer counts
  as holding anything, so its pieces go to the other peers or the origin, and it is dropped for
  the rest of the pull (``Node.drop``: never dialled again, and its address filtered where no
  other listed peer shares it);
- **a piece**: one in libtorrent's download queue whose blocks have not advanced for
  ``PIECE_DEADLINE_S`` is *late*, and the origin reads it whoever holds it (its bytes are handed to
  libtorrent, which checks them against the merkle tree like a peer's and cancels the requests).

A peer that holds nothing we want, or has nothing of ours to answer, is idle, not stalled: its
clock does not run. libtorrent's own timeouts (``node``) re-ask a late block of another peer first.

A peer that lies (a block that fails its piece's hash) is dropped the same way at its first
failed piece: it delivers bytes, so no deadline would catch it, and while it counted as holding
every piece the origin read only the pieces that had failed, two at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Endpoint = tuple[str, int]

# a delivering peer sends a 16 KiB block well within this, even one upload slot among dozens
# on a busy 2-core machine (libtorrent queues about 3 s of requests per peer): generous, since
# a stall costs a peer the rest of the pull
PEER_DEADLINE_S = 6.0
PIECE_DEADLINE_S = 8.0


def endpoint(peer) -> Endpoint:
    """A libtorrent ``peer_info``'s remote address as (ip, port)."""
    return str(peer.ip[0]), int(peer.ip[1])


@dataclass
class PeerWatch:
    """Per connected peer: the payload it has sent, and since when it owes us something."""

    ok_since: dict[Endpoint, float] = field(default_factory=dict)  # last byte, or last owing nothing
    sent: dict[Endpoint, int] = field(default_factory=dict)
    stalled: set[Endpoint] = field(default_factory=set)  # stalled or lying: for the rest of the pull

    def update(self, peers, now: float) -> list[Endpoint]:
        """Read ``peers`` (libtorrent ``peer_info``, handshake done); the endpoints newly stalled
        (or caught sending a bad block)."""
        import libtorrent as lt

        new = []
        for peer in peers:
            where = endpoint(peer)
            if where in self.stalled:
                continue
            total = int(peer.total_download)
            owes = bool(peer.flags & lt.peer_info.interesting) and (
                bool(peer.flags & lt.peer_info.remote_choked) or peer.download_queue_length > 0
            )
            if where not in self.ok_since or total != self.sent.get(where) or not owes:
                self.ok_since[where] = now  # a new connection, a byte, or nothing asked of it
            self.sent[where] = total
            if now - self.ok_since[where] > PEER_DEADLINE_S or peer.num_hashfails:
                self.stalled.add(where)
                new.append(where)
        return new


@dataclass
class PieceWatch:
    """Per piece in libtorrent's download queue: how far its blocks got, and since when."""

    progress: dict[int, tuple[int, float]] = field(default_factory=dict)

    def late(self, queue: list[dict], now: float) -> set[int]:
        """The queued pieces (``get_download_queue()``) whose blocks have not advanced for
        ``PIECE_DEADLINE_S``."""
        found, current = set(), {}
        for entry in queue:
            piece = int(entry["piece_index"])
            done = sum(
                int(b.get("block_size", 0))
                if int(b.get("state", 0)) >= 2
                else int(b.get("bytes_progress", 0))
                for b in entry.get("blocks", [])
            )
            before = self.progress.get(piece)
            since = before[1] if before is not None and before[0] == done else now
            current[piece] = (done, since)
            if now - since > PIECE_DEADLINE_S:
                found.add(piece)
        self.progress = current
        return found
