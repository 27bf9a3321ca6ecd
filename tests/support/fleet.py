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
    from quantgate.errors import QuantgateError
    from quantgate.fleet import FleetSettings, open_node, seed_cache
    from quantgate.publish import PullCache, RegistryConfig, pull

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


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))
