"""A version's files from the fleet's peers first and its origin last, into a pull's staging.

``fetch`` runs one torrent in the node's engine, in three steps: the torrent (given, from the
store, or by its signed info-hash from the peers when the store lost it or is down), then
``manifest.json`` and ``manifest.sig`` alone, which the caller verifies (signature, approval)
before anything else is fetched, then every file, in the serving engine's load order. Peers are
untrusted: libtorrent checks every block against the file's merkle tree (whose root the signed
info-hash covers) and drops a peer that sends bad blocks, and the caller then re-hashes every file
against the signed manifest before it installs anything.

Peers are a speed-up, never a dependency. The origin (``origin``) is read for a piece that failed
its hash check, that no delivering peer holds, or that is late (``watch``: no new block for
``PIECE_DEADLINE_S``); a peer that owes us blocks and sends nothing for ``PEER_DEADLINE_S`` is
stalled and dropped for the pull, and once no connected peer is left delivering, the origin reads
at full concurrency. So with the origin up, silent, frozen and lying peers cost at most those
deadlines: the bound the README states. The torrent by info-hash waits for the peers only while the
store cannot be reached; a store that answers but lost its torrent gets ``METADATA_WAIT_S`` of
peers, then ``NoTorrent`` (the caller pulls from the origin alone). No byte from anywhere for
``stall_s``: exit 75, and the verified pieces stay in staging for the next pull (libtorrent
re-checks them when it starts). A write that fails for want of space is ``OSError(ENOSPC)``,
which the caller turns into exit 75 with staging dropped, as the origin path does.
"""

from __future__ import annotations

import contextlib
import errno
import random
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from quantgate.contracts.artifact import MANIFEST, Manifest
from quantgate.fleet import torrent as torrents
from quantgate.fleet.node import Node, closed_flags
from quantgate.fleet.order import load_order
from quantgate.fleet.origin import RangeReader
from quantgate.fleet.pieces import complete, held, want, wanted_pieces
from quantgate.fleet.watch import PEER_DEADLINE_S, PeerWatch, PieceWatch, endpoint
from quantgate.runtime.errors import QuantgateError, RegistryUnavailableError
from quantgate.runtime.progress import SILENT, Progress

SIGNATURE = "manifest.sig"
TICK_S = 0.05
FLUSH_S = 60.0
# peers first: the origin waits until every listed peer has answered (connected, or refused), at
# most this long (libtorrent dials on its one-second tick, and a handshake is a few round trips)
ORIGIN_AFTER_S = 4.0
ORIGIN_RETRY_S = 5.0  # a piece handed over from the origin and still missing this long is read again
HAVE_WAIT_S = 1.0  # a connected peer that has said nothing of its pieces for this long holds none
ORIGIN_WITH_PEERS = 2  # origin reads in flight while peers are connected (they share the rest)
ORIGIN_WINDOW = 64  # origin reads pick at random among this many missing pieces, in load order
ORIGIN_BACKOFF_S = (0.5, 8.0)  # after a failed origin read, wait (doubling) before the next
ORIGIN_BAD_PIECES = 2  # the origin's bytes failed a piece's hash this often: the store is damaged
# the store answers but holds no torrent: the peers have this long to send it by its info-hash
METADATA_WAIT_S = ORIGIN_AFTER_S + PEER_DEADLINE_S


class TorrentRefused(ValueError):
    """The swarm's torrent or the origin's bytes are not what the signed info-hash says."""


class NoTorrent(Exception):
    """No peer sent the torrent by its info-hash within the wait given: the origin alone, then."""


@dataclass
class Transfer:
    """Where a pull's bytes came from."""

    peer_bytes: int = 0  # payload received from peers (including any they sent twice or bad)
    origin_bytes: int = 0  # read from the store as pieces
    bad_pieces: int = 0  # pieces that failed their hash check (a bad peer's, or the origin's)
    peers: int = 0  # peers connected at some point
    stalled: int = 0  # peers dropped: owing blocks past PEER_DEADLINE_S, or a block that failed its hash
    late_pieces: int = 0  # pieces read from the origin because no peer delivered them in time

    def describe(self) -> str:
        """One line for the pull's report."""
        return (
            f"{self.peer_bytes:,} bytes from {self.peers} peer(s), {self.origin_bytes:,} from the origin"
            + (f", {self.bad_pieces} bad piece(s) caught and fetched again" if self.bad_pieces else "")
            + (f", {self.stalled} stalled or lying peer(s) dropped" if self.stalled else "")
            + (f", {self.late_pieces} late piece(s) read from the origin" if self.late_pieces else "")
        )


class _Swarm:
    """One torrent in a node's engine, driven to completion of the files it is asked for."""

    def __init__(
        self,
        node: Node,
        handle,
        reader: RangeReader | None,
        concurrency: int,
        stall_s: float,
        where: str,
    ) -> None:
        self.node, self.handle, self.reader, self.where = node, handle, reader, where
        self.concurrency, self.stall_s = concurrency, stall_s
        self.transfer = Transfer()
        self.inflight: dict[int, Future] = {}
        self.from_origin: dict[int, int] = {}  # piece added from the origin -> times it failed
        self.backoff_until, self.backoff = 0.0, ORIGIN_BACKOFF_S[0]
        self.origin_error: str | None = None
        self.seen: set[tuple[str, int]] = set()
        self.pool = ThreadPoolExecutor(max(1, concurrency), thread_name_prefix="origin")
        self.last_done, self.last_change = -1, time.monotonic()
        self.layout: dict[int, list[tuple[str, int, int]]] = {}
        self.started = time.monotonic()
        self.failed: set[int] = set()  # pieces that failed their hash check once
        self.answered: set[tuple[str, int]] = set()  # listed peers that connected or refused
        self.handshaken: dict[tuple[str, int], float] = {}
        self.added: dict[int, float] = {}  # piece -> when the origin's bytes were handed over
        self.peer_watch, self.piece_watch = PeerWatch(), PieceWatch()
        self.late: set[int] = set()

    # -- the loop ------------------------------------------------------------------------------
    def until(
        self,
        done: Callable[[], bool],
        wanted: list[int],
        on_bytes: Callable[[int], None],
        give_up_s: float | None = None,
    ) -> None:
        """Run until ``done()``: peers connected, alerts read, origin reads for ``wanted`` pieces
        (in order) that no delivering peer has or that are late; RegistryUnavailableError after
        ``stall_s`` without a byte; ``NoTorrent`` after ``give_up_s`` when given."""
        given_up = None if give_up_s is None else time.monotonic() + give_up_s
        while not done():
            if given_up is not None and time.monotonic() > given_up:
                raise NoTorrent(f"no peer sent the torrent within {give_up_s:.0f} s")
            self.node.connect_peers(self.handle)
            self._alerts()
            self._origin(wanted)
            status = self.handle.status()
            if status.total_wanted_done != self.last_done:
                if self.last_done >= 0:
                    on_bytes(max(0, status.total_wanted_done - self.last_done))
                self.last_done, self.last_change = status.total_wanted_done, time.monotonic()
            elif time.monotonic() - self.last_change > self.stall_s:
                why = f"; the origin: {self.origin_error}" if self.origin_error else ""
                raise RegistryUnavailableError(
                    self.where,
                    f"no byte from {len(self.seen)} peer(s) or the origin for {self.stall_s:.0f} s{why}",
                    "retry when a peer or the store is reachable; pieces already verified are kept",
                )
            self.node.session.wait_for_alert(int(TICK_S * 1000))
        self._alerts()
        self._flush()

    def _flush(self) -> None:
        """Wait until what libtorrent has verified is on disk (it writes behind its hash checks)."""
        import libtorrent as lt

        self.handle.flush_cache()
        deadline = time.monotonic() + FLUSH_S
        while time.monotonic() < deadline:
            self.node.session.wait_for_alert(int(TICK_S * 1000))
            for alert in self.node.session.pop_alerts():
                if not isinstance(alert, lt.torrent_alert) or alert.handle != self.handle:
                    continue
                # a piece counts as done once hashed, before it is written: a write that fails
                # (a full disk) is told here, and must end the pull as one (it left the file short)
                if isinstance(alert, lt.file_error_alert | lt.torrent_error_alert):
                    raise _disk_error(alert, self.where)
                if isinstance(alert, lt.cache_flushed_alert):
                    return
        raise OSError(f"{self.where}: the pieces were not written to disk within {FLUSH_S:.0f} s")

    def _alerts(self) -> None:
        import libtorrent as lt

        for alert in self.node.session.pop_alerts():
            if isinstance(alert, lt.torrent_alert) and alert.handle != self.handle:
                continue  # another torrent of this engine (a version it seeds)
            if isinstance(alert, lt.hash_failed_alert):
                self.transfer.bad_pieces += 1
                self.failed.add(alert.piece_index)  # the origin's to send now, whoever has it
                if alert.piece_index in self.from_origin:
                    self.from_origin[alert.piece_index] += 1
                    if self.from_origin[alert.piece_index] >= ORIGIN_BAD_PIECES:
                        raise TorrentRefused(
                            f"the origin's bytes of piece {alert.piece_index} fail its hash "
                            f"{ORIGIN_BAD_PIECES} times (the store's copy is damaged)"
                        )
            elif isinstance(alert, lt.piece_finished_alert):
                self.from_origin.pop(alert.piece_index, None)
                self.failed.discard(alert.piece_index)
            elif isinstance(alert, lt.peer_ban_alert):  # libtorrent caught it lying: gone for the pull
                self._drop((str(alert.endpoint[0]), int(alert.endpoint[1])))
            elif isinstance(alert, lt.peer_error_alert | lt.peer_disconnected_alert):
                self.answered.add((str(alert.endpoint[0]), int(alert.endpoint[1])))
            elif isinstance(alert, lt.file_error_alert | lt.torrent_error_alert):
                raise _disk_error(alert, self.where)

    # -- the origin ----------------------------------------------------------------------------
    def _origin(self, wanted: list[int]) -> None:
        import libtorrent as lt

        for piece, future in list(self.inflight.items()):
            if not future.done():
                continue
            del self.inflight[piece]
            try:
                data = future.result()
            except (OSError, QuantgateError) as exc:  # the store is down or failing: peers may still
                self.origin_error = str(exc).splitlines()[0][:200]
                self.backoff_until = time.monotonic() + self.backoff
                self.backoff = min(self.backoff * 2, ORIGIN_BACKOFF_S[1])
                continue
            self.backoff = ORIGIN_BACKOFF_S[0]
            self.transfer.origin_bytes += len(data)
            if not self.handle.have_piece(piece):
                self.from_origin.setdefault(piece, 0)
                self.added[piece] = time.monotonic()
                # over whatever a peer sent of it so far (a lying peer's blocks included)
                self.handle.add_piece(piece, data, lt.torrent_handle.overwrite_existing)
        now = time.monotonic()
        peers = self.handle.get_peer_info()
        self.seen |= {endpoint(p) for p in peers if p.total_download}
        pending = lt.peer_info.handshake | lt.peer_info.connecting
        talking = [p for p in peers if not p.flags & pending]
        for p in talking:  # a peer has answered once it said what it holds (or had time to)
            since = self.handshaken.setdefault(endpoint(p), now)
            if p.flags & lt.peer_info.seed or p.num_pieces or now - since >= HAVE_WAIT_S:
                self.answered.add(endpoint(p))
        for stalled in self.peer_watch.update(talking, now):
            self._drop(stalled)
        # the peers that count: answered, and not stalled (a dropped peer may linger, connected)
        delivering = [p for p in talking if endpoint(p) not in self.peer_watch.stalled]
        waiting = now - self.started < ORIGIN_AFTER_S and not self.node.listed() <= self.answered
        if self.reader is None or now < self.backoff_until or waiting:
            return
        limit = self.concurrency if not delivering else ORIGIN_WITH_PEERS
        if len(self.inflight) >= limit:
            return
        late = self.piece_watch.late(self.handle.get_download_queue(), now)
        recent = {p for p, at in self.added.items() if now - at < ORIGIN_RETRY_S}
        busy = set(self.inflight) | (set(self.from_origin) & recent)  # read, or added and being checked
        holding = held(delivering)

        def from_origin(p: int) -> bool:  # failed its hash, late, or no delivering peer holds it
            if p in busy or self.handle.have_piece(p):
                return False
            return p in self.failed or p in late or (holding is not None and p not in holding)

        missing = [p for p in wanted if from_origin(p)]
        # this node's share first (piece % nodes == its place in the sorted list): nodes listed
        # together read different pieces from the origin and swap them; then the rest, at random
        share, others = self.node.share()
        own = [p for p in missing if p % others == share]
        window = [p for p in missing if p % others != share][:ORIGIN_WINDOW]
        random.shuffle(window)
        for piece in (own + window)[: limit - len(self.inflight)]:
            if piece in late and piece not in self.late:
                self.late.add(piece)
                self.transfer.late_pieces += 1
            self.inflight[piece] = self.pool.submit(self._read_piece, piece)

    def _drop(self, peer: tuple[str, int]) -> None:
        """``peer`` stalled or lied: its pieces go to the other peers or the origin from now on."""
        if peer not in self.node.dropped:
            self.peer_watch.stalled.add(peer)
            self.node.drop(peer)
            self.transfer.stalled += 1

    def plan(self, found: torrents.Torrent, pieces: list[int]) -> None:
        """Where each of ``pieces`` lies in the files (read here, in the engine's thread: the
        origin's reader threads make no libtorrent call)."""
        info = found.info
        names = {index: rel for rel, (index, _) in found.files.items()}
        for piece in pieces:
            if piece not in self.layout:
                self.layout[piece] = [  # v2: a piece is one file's bytes (its padding is not sent)
                    (names[part.file_index], part.offset, part.size)
                    for part in info.map_block(piece, 0, info.piece_size(piece))
                    if part.file_index in names
                ]

    def _read_piece(self, piece: int) -> bytes:
        assert self.reader is not None
        data = bytearray()
        for rel, offset, size in self.layout[piece]:
            data += self.reader(rel, offset, size)
        return bytes(data)

    def close(self) -> None:
        """Stop origin reads (those in flight finish in their threads and are dropped)."""
        for future in self.inflight.values():
            future.cancel()
        self.pool.shutdown(wait=False, cancel_futures=True)


def _disk_error(alert, where: str) -> OSError:
    """libtorrent's failed write or read as an OSError carrying its errno (ENOSPC: exit 75 with
    staging dropped, as the origin path does) and the file it names."""
    code = alert.error
    number = code.value() if code.category().name() in ("system", "generic") else 0
    filename = alert.filename() if hasattr(alert, "filename") else None
    if number in (errno.ENOSPC, errno.EDQUOT):
        return OSError(number, "no space left on device", filename or where)
    return OSError(number or errno.EIO, f"{where}: {alert.message()}", filename)


def fetch(
    node: Node,
    *,
    info_hash: str,
    name: str,
    save_path: Path,
    torrent_data: bytes | None,
    reader: RangeReader | None,
    verify_manifest: Callable[[Path, bytes], Manifest],
    concurrency: int,
    where: str,
    progress: Progress = SILENT,
    metadata_wait_s: float | None = None,
) -> tuple[Manifest, bytes, bytes | None, Transfer]:
    """The version's files into ``save_path/name`` (its staging directory).

    Returns the manifest ``verify_manifest(manifest path, signature)`` accepted, the signature,
    the torrent's bytes (its signed part: the node keeps them to seed the entry; None when it
    cannot) and the ``Transfer``.
    ``TorrentRefused`` when the swarm's torrent does not describe the signed manifest;
    ``NoTorrent`` when ``torrent_data`` is None and no peer sent it within ``metadata_wait_s``
    (None: as long as bytes may come, ``stall_s``).
    """
    import libtorrent as lt

    params = lt.add_torrent_params()
    if torrent_data is not None:  # libtorrent gets the signed part alone: no tracker, no web seed
        torrent_data = torrents.signed_part(torrent_data)
        params.ti = lt.torrent_info(torrent_data)
    else:  # ut_metadata sends the info dictionary alone
        params.info_hashes = lt.info_hash_t(lt.sha256_hash(bytes.fromhex(info_hash)))
    params.save_path = str(save_path)
    if torrent_data is not None:  # priorities are set below; by info-hash, every file stays wanted so
        # that the torrent is never finished with nothing wanted, when libtorrent drops its seeds
        params.flags |= lt.torrent_flags.default_dont_download
    params.flags &= ~(lt.torrent_flags.auto_managed | lt.torrent_flags.paused)
    params.flags |= closed_flags()
    handle = node.session.add_torrent(params)
    swarm = _Swarm(node, handle, reader, concurrency, node.fleet.stall_s, where)
    try:
        swarm.until(lambda: handle.status().has_metadata, [], lambda n: None, metadata_wait_s)
        try:
            found = torrents.parsed(handle.torrent_file(), info_hash, name)
        except ValueError as exc:
            raise TorrentRefused(str(exc)) from None
        first = [r for r in (MANIFEST, SIGNATURE) if r in found.files]
        want(handle, found, first)
        pieces = wanted_pieces(found, first)
        swarm.plan(found, pieces)
        swarm.until(
            complete(handle, [found.files[r][0] for r in first], [found.files[r][1] for r in first]),
            pieces,
            lambda n: None,
        )
        staging = save_path / name
        signature = (staging / SIGNATURE).read_bytes() if SIGNATURE in found.files else b""
        manifest = verify_manifest(staging / MANIFEST, signature)
        expected = {rel: e.bytes for rel, e in manifest.files.items()} | {MANIFEST: found.files[MANIFEST][1]}
        sizes = {rel: size for rel, (_, size) in found.files.items() if rel != SIGNATURE}
        if sizes != expected:
            extra = sorted(set(sizes) ^ set(expected)) or sorted(r for r in sizes if sizes[r] != expected[r])
            raise TorrentRefused(f"does not hold the signed manifest's files ({extra[0]!r} differs)")
        order = load_order(list(manifest.files), staging)
        want(handle, found, first + order)
        handle.set_flags(lt.torrent_flags.sequential_download)  # from peers too: load order
        rest = [found.files[r] for r in order]
        pieces = wanted_pieces(found, order)
        swarm.plan(found, pieces)
        with progress.task(f"pull {name[:12]} from peers", sum(s for _, s in rest)) as bar:
            swarm.until(complete(handle, [i for i, _ in rest], [s for _, s in rest]), pieces, bar.advance)
        torrent_bytes = torrent_data if torrent_data is not None else _bencoded(found, staging)
        status = handle.status()
        swarm.transfer.peer_bytes = int(status.total_payload_download)
        swarm.transfer.peers = len(swarm.seen)
        return manifest, signature, torrent_bytes, swarm.transfer
    finally:
        swarm.close()
        _remove(node, handle)
        with contextlib.suppress(OSError):
            (save_path / f".{info_hash[:40]}.parts").unlink()


def _bencoded(found: torrents.Torrent, staging: Path) -> bytes | None:
    """The torrent of a version fetched by its info-hash alone (libtorrent keeps no piece layers to
    write out), made again from the verified files; None when it does not come out the same."""
    try:
        data = torrents.make(found.name, {rel: staging / rel for rel in found.files})
        return data if torrents.info_hash(data) == found.info_hash else None
    except (OSError, ValueError, RuntimeError):
        return None


def _remove(node: Node, handle) -> None:
    """Take the torrent out of the engine and wait until its files are closed (bounded)."""
    import libtorrent as lt

    node.session.remove_torrent(handle)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        node.session.wait_for_alert(100)
        if any(isinstance(a, lt.torrent_removed_alert) for a in node.session.pop_alerts()):
            return
