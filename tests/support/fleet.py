"""Fleet nodes on loopback for tests and the benchmark: a node is a process with its own cache
and port that pulls a version (library ``pull``) and then seeds its cache, and a proxy that
flips bytes in the pieces a peer sends (a lying peer: libtorrent refuses to upload a piece that
fails its own hash check, so the lie has to be told on the wire).

Run as ``python -m support.fleet <job.json>``: the job names the registry config (JSON), the
cache, the fleet settings, what to do (``pull``, ``seed``, ``pull+seed``) and a result file
written when the pull ends: path, seconds, peer and origin bytes, or the error and exit code.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

PIECE = 7  # BitTorrent's piece message id


def write_job(path: Path, **job) -> Path:
    """A node's job file (see the module docstring)."""
    path.write_text(json.dumps(job, default=str))
    return path


@contextlib.contextmanager
def node_process(job: Path, log: Path) -> Iterator[subprocess.Popen]:
    """``python -m support.fleet job`` in its own process group, killed on the way out."""
    tests = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")])}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "support.fleet", str(job)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def seed_process(cache: Path, root: Path, listen: str, log: Path, **env: str) -> Iterator[subprocess.Popen]:
    """``quantgate seed --cache-dir CACHE --root ROOT`` listening on ``listen`` (and ``env``, e.g.
    ``QUANTGATE_FLEET_UPLOAD_MB_S``), in its own process group; yielded once it says it is seeding,
    killed on the way out (a stopped one is continued first, so that the kill is delivered)."""
    settings = {**os.environ, "QUANTGATE_FLEET_LISTEN": listen, **env}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "quantgate.cli", "seed", "--cache-dir", str(cache), "--root", str(root)],
            env=settings,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while "seeding" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"quantgate seed did not start: {log.read_text()[-3000:]}")
            time.sleep(0.1)
        yield proc
    finally:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
        proc.wait()


def wait_for(path: Path, proc: subprocess.Popen | None, timeout_s: float, log: Path | None = None) -> dict:
    """The JSON in ``path`` once it appears (the node's result or readiness)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            with contextlib.suppress(ValueError):
                return json.loads(path.read_text())
        if proc is not None and proc.poll() is not None and not path.exists():
            raise RuntimeError(f"node exited {proc.returncode}: {log.read_text()[-3000:] if log else ''}")
        time.sleep(0.1)
    raise TimeoutError(
        f"{path} did not appear within {timeout_s:.0f} s: {log.read_text()[-3000:] if log else ''}"
    )


def _main(job_path: str) -> int:
    from quantgate.fleet import FleetSettings, open_node, seed_cache
    from quantgate.publish import PullCache, RegistryConfig, pull
    from quantgate.runtime.errors import QuantgateError

    job = json.loads(Path(job_path).read_text())
    cfg = RegistryConfig.model_validate_json(job["registry"])
    fleet = FleetSettings(**job["fleet"])
    cfg = cfg.model_copy(update={"fleet": fleet})
    cache = Path(job["cache"])
    if job.get("start_at"):
        time.sleep(max(0.0, job["start_at"] - time.time()))
    if "pull" in job["action"]:
        started = time.monotonic()
        result: dict = {}
        try:
            path = pull(job["model"], job["target"], job["tenant"], cfg, cache_dir=cache)
            record = json.loads((path.parent / ".records" / f"{path.name}.json").read_text())
            result = {
                "exit_code": 0,
                "path": str(path),
                "peer_bytes": int(record.get("peer_bytes", 0)),
                "origin_bytes": int(record.get("origin_bytes", 0)),
            }
        except QuantgateError as exc:
            result = {"exit_code": exc.exit_code, "error": str(exc)}
        result["seconds"] = time.monotonic() - started
        result["finished_at"] = time.time()
        Path(job["result"]).write_text(json.dumps(result))
        if result["exit_code"] != 0 or "seed" not in job["action"]:
            return int(result["exit_code"])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with open_node(fleet) as own:
        if job.get("ready"):
            Path(job["ready"]).write_text(json.dumps({"port": own.port}))
        seed_cache(own, PullCache(cache / "pull", cfg.cache_max_bytes), stop, rescan_s=0.5)
    return 0


class PeerProxy:
    """A TCP proxy to one peer that counts the block bytes the peer sends (``block_bytes``) and,
    with ``flip``, flips the first byte of every block (``flipped`` counts them).

    Plaintext only (the fleet's engine disables protocol encryption): the peer's stream is the
    68-byte handshake, then length-prefixed messages, of which ``piece`` (7) carries a block.
    """

    def __init__(self, upstream: tuple[str, int], flip: bool = False) -> None:
        self.upstream = upstream
        self.flip = flip
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.flipped = 0
        self.block_bytes = 0
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.server.settimeout(0.2)
        while not self._stop.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                continue
            try:
                peer = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            # no read timeout: a peer that freezes must look frozen (a proxy that closes after a
            # silence turned a SIGSTOPped seeder into a vanished one, which the pull always survived)
            peer.settimeout(None)
            client.settimeout(None)
            threading.Thread(target=self._pipe, args=(client, peer), daemon=True).start()
            threading.Thread(target=self._blocks, args=(peer, client), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _read(self, sock: socket.socket, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise OSError("closed")
            data += chunk
        return data

    def _blocks(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            dst.sendall(self._read(src, 68))  # the handshake
            while True:
                (length,) = struct.unpack(">I", self._read(src, 4))
                body = bytearray(self._read(src, length)) if length else bytearray()
                if length > 9 and body[0] == PIECE:
                    self.block_bytes += length - 9  # id, piece index, offset, then the block
                    if self.flip:
                        body[9] ^= 0xFF  # the block's first byte
                        self.flipped += 1
                dst.sendall(struct.pack(">I", length) + bytes(body))
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Stop accepting (connections in flight end when either side closes)."""
        self._stop.set()
        self.server.close()


class RawPeer:
    """A BitTorrent peer written by hand, on loopback, that lies the way a broken or hostile node
    does: it answers the handshake as a seed (HAVE_ALL and UNCHOKE, BEP 6), then, per ``mode``:

    - ``silent``: never sends another byte, and never closes (a frozen process, a partition without
      RST: the connection stays up, every request goes unanswered);
    - ``garbage``: answers every request with random bytes (a block that fails its merkle check);
    - ``pex``: tells the node of ``pex_to`` (an address nobody listed) in a ``ut_pex`` message
      (BEP 11), which a node that honours peer exchange dials, then closes the connection.

    ``connections`` counts the connections it accepted, ``requests`` the block requests it got.
    """

    def __init__(self, mode: str = "silent", pex_to: tuple[str, int] | None = None) -> None:
        self.mode, self.pex_to = mode, pex_to
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.connections = 0
        self.requests = 0
        self.pex_sent = False
        self._open: list[socket.socket] = []
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.server.settimeout(0.2)
        while not self._stop.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                continue
            self.connections += 1
            self._open.append(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    @staticmethod
    def _read(sock: socket.socket, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise OSError("closed")
            data += chunk
        return data

    def _serve(self, sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            hello = self._read(sock, 68)  # pstrlen, "BitTorrent protocol", reserved, info-hash, peer id
            reserved = bytearray(8)
            reserved[7] |= 0x04  # the fast extension: HAVE_ALL
            if self.mode == "pex":
                reserved[5] |= 0x10  # the extension protocol (BEP 10), which carries ut_pex
            sock.sendall(hello[:20] + bytes(reserved) + hello[28:48] + b"-QG0001-" + os.urandom(12))
            sock.sendall(struct.pack(">IB", 1, 14))  # HAVE_ALL: the first message after the handshake
            if self.mode == "pex":
                self._pex(sock)
                time.sleep(0.5)  # time to act on it; then gone (the pull is the origin's, and quick)
                sock.close()
                return
            sock.sendall(struct.pack(">IB", 1, 1))  # UNCHOKE
            while not self._stop.is_set():
                (length,) = struct.unpack(">I", self._read(sock, 4))
                body = self._read(sock, length) if length else b""
                if length == 13 and body[0] == 6:  # REQUEST: piece, offset, length
                    self.requests += 1
                    if self.mode == "garbage":
                        piece, offset, size = struct.unpack(">III", body[1:])
                        block = struct.pack(">IBII", 9 + size, PIECE, piece, offset) + os.urandom(size)
                        sock.sendall(block)

    def _pex(self, sock: socket.socket) -> None:
        """Our extended handshake, then (once the node's says which id it gave ut_pex, if any) one
        ut_pex message naming ``pex_to``."""
        from libtorrent import bdecode, bencode

        handshake = bencode({"m": {"ut_pex": 1}, "v": "quantgate-test"})
        sock.sendall(struct.pack(">IBB", 2 + len(handshake), 20, 0) + handshake)
        pex_id = 1  # libtorrent's, when it speaks ut_pex; sent even when it does not say so (hostile)
        for _ in range(20):  # the node's own extended handshake comes among its first messages
            (length,) = struct.unpack(">I", self._read(sock, 4))
            body = self._read(sock, length) if length else b""
            if length > 2 and body[0] == 20 and body[1] == 0:
                theirs = bdecode(body[2:]) or {}
                pex_id = (theirs.get(b"m") or {}).get(b"ut_pex") or pex_id
                break
        assert self.pex_to is not None
        host, port = self.pex_to
        added = socket.inet_aton(host) + struct.pack(">H", port)
        message = bencode({"added": added, "added.f": b"\x02", "dropped": b""})
        sock.sendall(struct.pack(">IBB", 2 + len(message), 20, pex_id) + message)
        self.pex_sent = True

    def close(self) -> None:
        """Stop accepting and drop every connection (a test's end, not a fault)."""
        self._stop.set()
        self.server.close()
        for sock in self._open:
            with contextlib.suppress(OSError):
                sock.close()


class Listener:
    """A TCP port that counts the connections made to it and answers nothing (an address nobody
    listed: a node must never dial it); with ``http``, an HTTP server counting its requests (a
    tracker or web seed a torrent names outside its signed part)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.connections = 0
        self.first_bytes: list[bytes] = []
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.server.settimeout(0.2)
        while not self._stop.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                continue
            self.connections += 1
            client.settimeout(1)
            with contextlib.suppress(OSError):
                self.first_bytes.append(client.recv(200))
            with contextlib.suppress(OSError):
                client.sendall(b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            client.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._stop.set()
        self.server.close()


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))
