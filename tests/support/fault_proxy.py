"""An HTTP reverse proxy on loopback that injects faults between a client and a test server.

Why a proxy rather than a hook inside boto3: a fault injected from outside reaches the client as
the network delivers it (a reset socket, a body cut short under a Content-Length that promised
more, a 503 with Retry-After), so the client's whole stack, its retries included, is what the
test exercises. Standard library only; one thread per connection; every request counted.

``FaultProxy(upstream)`` forwards to ``upstream`` (e.g. the moto S3 server) and applies the
first matching ``Fault`` of its schedule to each request: ``count`` of them, or every one when
``count`` is None (a persistent fault). ``on_request`` is called with each request before it is
forwarded, so a test can act at a precise point (stop a server after the first upload).
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal, Self
from urllib.parse import urlparse

FaultKind = Literal["reset", "status", "delay", "truncate_response", "truncate_upload", "drop_response"]
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}
S3_ERROR_CODES = {500: "InternalError", 502: "BadGateway", 503: "ServiceUnavailable", 504: "GatewayTimeout"}


@dataclass
class Fault:
    """One kind of fault, for the requests it matches.

    - ``reset``: the request is read, never forwarded, and the connection reset (TCP RST).
    - ``status``: answered here with ``status`` (an S3-style XML error), ``Retry-After`` if set.
    - ``delay``: forwarded after ``delay_s`` seconds (past a client's read timeout, it times out).
    - ``truncate_response``: forwarded; the client gets the full Content-Length but only
      ``keep`` of the body, then a reset (applies to responses with a body: use ``method="GET"``).
    - ``truncate_upload``: the upstream gets only ``keep`` of the request body (Content-Length
      adjusted), as a proxy that lost the end of an upload would send it.
    - ``drop_response``: forwarded and done upstream, but the connection is reset before the
      response: the client cannot tell whether its request took effect.
    """

    kind: FaultKind
    count: int | None = 1  # how many matching requests it hits; None: every one (persistent)
    method: str | None = None  # only requests with this method (GET, PUT, HEAD, POST, ...)
    path_contains: str = ""
    status: int = 500
    retry_after_s: int | None = None
    delay_s: float = 0.0
    keep: float = 0.5  # fraction of the body that gets through a truncation
    hits: int = field(default=0, init=False)

    def matches(self, method: str, path: str) -> bool:
        """Whether this fault applies to the request (and has hits left)."""
        if self.count is not None and self.hits >= self.count:
            return False
        return (self.method is None or self.method == method) and self.path_contains in path


@dataclass(frozen=True)
class Seen:
    """One request the proxy handled: what it was and what was done to it."""

    method: str
    path: str
    fault: FaultKind | None
    status: int | None  # the status sent (None: reset before a status line, or a delayed request)


class FaultProxy:
    """A threaded reverse proxy on 127.0.0.1 in front of ``upstream`` with a fault schedule."""

    def __init__(self, upstream: str) -> None:
        parsed = urlparse(upstream)
        self.upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.faults: list[Fault] = []
        self.seen: list[Seen] = []
        self.on_request: Callable[[str, str], None] | None = None
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)

    def schedule(self, *faults: Fault) -> None:
        """Replace the schedule (and forget what was seen): the first matching fault applies."""
        with self._lock:
            self.faults = list(faults)
            self.seen = []

    def clear(self) -> None:
        """No more faults: every request is forwarded untouched."""
        self.schedule()

    def count(self, method: str | None = None, *, faulted: bool | None = None) -> int:
        """Requests seen (of ``method``; only faulted, or only clean, ones if asked)."""
        with self._lock:
            return sum(
                1
                for s in self.seen
                if (method is None or s.method == method)
                and (faulted is None or (s.fault is not None) == faulted)
            )

    def _pick(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.matches(method, path):
                    fault.hits += 1
                    return fault
        return None

    def _record(self, seen: Seen) -> None:
        with self._lock:
            self.seen.append(seen)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def _read_body(handler: BaseHTTPRequestHandler) -> bytes:
    """The request body, whether sent with Content-Length or chunked (boto3's aws-chunked uploads)."""
    if "chunked" in handler.headers.get("Transfer-Encoding", "").lower():
        parts = []
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers, which HTTP chunking allows and S3 does not use here
                return b"".join(parts)
            parts.append(handler.rfile.read(size))
            handler.rfile.readline()
    length = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(length) if length else b""


def _reset(handler: BaseHTTPRequestHandler) -> None:
    """Close the client's connection with a TCP RST (SO_LINGER 0), as a crashed peer would."""
    handler.wfile.flush()
    handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    handler.connection.close()
    handler.close_connection = True


def _handler_for(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as boto3's connection pool expects

        def log_message(self, format: str, *args: object) -> None:  # the base class names it format
            """Quiet: the test reads ``proxy.seen`` instead of a log."""

        def _handle(self) -> None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client gave up
                self._proxy_one()

        def _proxy_one(self) -> None:
            method, path = self.command, self.path
            body = _read_body(self)
            if proxy.on_request is not None:
                proxy.on_request(method, path)
            fault = proxy._pick(method, path)
            kind = fault.kind if fault else None
            if fault and fault.kind == "reset":
                proxy._record(Seen(method, path, kind, None))
                _reset(self)
                return
            if fault and fault.kind == "status":
                self._error(fault)
                proxy._record(Seen(method, path, kind, fault.status))
                return
            if fault and fault.kind == "delay":
                proxy._record(Seen(method, path, kind, None))  # counted now: the client may give up first
                time.sleep(fault.delay_s)
            if fault and fault.kind == "truncate_upload":
                body = body[: int(len(body) * fault.keep)]
            try:
                status, reason, headers, data = self._forward(method, path, body)
            except OSError:  # the upstream is down: the client sees its connection dropped
                if kind != "delay":
                    proxy._record(Seen(method, path, kind, None))
                _reset(self)
                return
            if fault and fault.kind == "drop_response":
                proxy._record(Seen(method, path, kind, None))
                _reset(self)
                return
            self.send_response(status, reason)
            for key, value in headers:
                if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
                    self.send_header(key, value)
            length = {k.lower(): v for k, v in headers}.get("content-length", "0")
            self.send_header("Content-Length", length if method == "HEAD" else str(len(data)))
            self.end_headers()
            if fault and fault.kind == "truncate_response" and data:
                self.wfile.write(data[: int(len(data) * fault.keep)])
                proxy._record(Seen(method, path, kind, status))
                _reset(self)
                return
            if method != "HEAD":
                self.wfile.write(data)
            if kind != "delay":
                proxy._record(Seen(method, path, kind, status))

        def _forward(self, method: str, path: str, body: bytes) -> tuple[int, str, list, bytes]:
            upstream = http.client.HTTPConnection(*proxy.upstream, timeout=120)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                headers["Content-Length"] = str(len(body))
                upstream.request(method, path, body=body, headers=headers)
                response = upstream.getresponse()
                data = response.read()
                return response.status, response.reason, response.getheaders(), data
            finally:
                upstream.close()

        def _error(self, fault: Fault) -> None:
            code = S3_ERROR_CODES.get(fault.status, "InternalError")
            payload = (
                b""
                if self.command == "HEAD"
                else (
                    f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                    f"<Message>injected by the fault proxy</Message></Error>"
                ).encode()
            )
            self.send_response(fault.status)
            self.send_header("Content-Type", "application/xml")
            if fault.retry_after_s is not None:
                self.send_header("Retry-After", str(fault.retry_after_s))
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle

    return Handler


@contextlib.contextmanager
def fault_proxy(upstream: str) -> Iterator[FaultProxy]:
    """A running ``FaultProxy`` in front of ``upstream``, shut down on exit."""
    with FaultProxy(upstream) as proxy:
        yield proxy
