"""Which pieces a pull asks for and who holds them: the piece arithmetic of ``fetch``.

A v2 torrent starts every file on a piece boundary, so a file is a run of pieces (``pieces``); a
step of the pull wants some files first (``want``: the manifest and its signature highest, every
other file still wanted at the lowest priority, so that libtorrent never counts the torrent
finished between steps and drops its seeds) and waits until they are whole (``complete``); the
origin reads what no delivering peer holds (``held``).
"""

from __future__ import annotations

from collections.abc import Callable

from quantgate.fleet import torrent as torrents


def held(peers) -> set[int] | None:
    """The pieces ``peers`` hold; None when one of them is a seed (it holds every piece)."""
    import libtorrent as lt

    held: set[int] = set()
    for peer in peers:
        if peer.flags & lt.peer_info.seed:
            return None
        if peer.num_pieces:
            held.update(i for i, has in enumerate(peer.pieces) if has)
    return held


def pieces(info, index: int, size: int) -> list[int]:
    """The pieces file ``index`` (``size`` bytes) spans."""
    if size == 0:
        return []
    first = info.map_file(index, 0, 0).piece
    last = info.map_file(index, size - 1, 0).piece
    return list(range(first, last + 1))


def complete(handle, indices: list[int], sizes: list[int]) -> Callable[[], bool]:
    """Whether files ``indices`` are whole (``sizes`` bytes each), as libtorrent counts them."""

    def done() -> bool:
        progress = handle.file_progress(1)  # piece granularity: complete files are exact
        return all(progress[i] >= s for i, s in zip(indices, sizes, strict=True))

    return done


def want(handle, found: torrents.Torrent, rels: list[str]) -> None:
    """``rels`` first (the manifest and its signature highest), then every other file at the
    lowest priority: wanted, so the torrent never counts as finished between the steps (libtorrent
    drops its connections to seeds then), and peers may send them, which the merkle tree checks."""
    priorities = [1] * found.info.num_files()
    for rank, rel in enumerate(rels):
        priorities[found.files[rel][0]] = 7 if rank < 2 else 4
    handle.prioritize_files(priorities)


def wanted_pieces(found: torrents.Torrent, rels: list[str]) -> list[int]:
    """The pieces of ``rels``, in their order, each once."""
    ordered: list[int] = []
    for rel in rels:
        index, size = found.files[rel]
        ordered += pieces(found.info, index, size)
    return list(dict.fromkeys(ordered))
