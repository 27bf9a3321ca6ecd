"""Real registry servers on loopback, for tests, benchmarks and trying the fleet path locally.

Test support, not product: it carries moto's test credentials (``support`` is never imported
by ``src/quantgate``).

``moto_s3`` runs moto's S3 server (an S3 API, in memory) and ``mlflow_server`` runs
``mlflow server`` with an SQLite backend, each as a child process on a free 127.0.0.1 port,
stopped (by its own pid) when the context exits. The MLflow server is started with
``--no-serve-artifacts`` and an ``s3://`` default artifact root: clients then get ``s3://``
URIs and move bytes with boto3 directly, as the fleet does (artifacts_registry/README.md).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

# moto accepts any credentials; boto3 still needs some to sign requests
TEST_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait(ready: Callable[[], bool], proc: subprocess.Popen, log: Path, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {log.read_text()[-2000:]}")
        with contextlib.suppress(Exception):
            if ready():
                return
        time.sleep(0.2)
    raise TimeoutError(f"{what} did not answer within {timeout_s:.0f} s: {log.read_text()[-2000:]}")


@contextlib.contextmanager
def _process(
    args: list[str], env: dict[str, str], ready: Callable[[], bool], what: str, timeout_s: float
) -> Iterator[subprocess.Popen]:
    with tempfile.TemporaryDirectory(prefix="quantgate-server-") as tmp:
        log = Path(tmp) / "server.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(
                args, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp, start_new_session=True
            )
        try:
            _wait(ready, proc, log, what, timeout_s)
            yield proc
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 15)  # its own session: the server and the workers it forked
            try:
                proc.wait(timeout=3)  # test servers hold nothing worth a slow, graceful stop
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()


@dataclass(frozen=True)
class S3Endpoint:
    """Where a test S3 server answers, and its one bucket."""

    url: str
    bucket: str

    def client(self):
        """A boto3 S3 client for this endpoint, signed with the test credentials."""
        import boto3

        return boto3.session.Session(
            aws_access_key_id=TEST_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=TEST_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=TEST_CREDENTIALS["AWS_DEFAULT_REGION"],
        ).client("s3", endpoint_url=self.url)


@contextlib.contextmanager
def moto_s3(bucket: str = "quantgate-registry", timeout_s: float = 30) -> Iterator[S3Endpoint]:
    """A moto S3 server with one bucket (names need 3+ characters)."""
    port = free_port()
    endpoint = S3Endpoint(f"http://127.0.0.1:{port}", bucket)
    env = {**os.environ, **TEST_CREDENTIALS}
    args = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with _process(
        args, env, lambda: endpoint.client().list_buckets() is not None, "moto S3 server", timeout_s
    ):
        endpoint.client().create_bucket(Bucket=bucket)
        yield endpoint


@contextlib.contextmanager
def mlflow_server(
    backend_uri: str,
    artifact_root: str,
    s3_endpoint: str | None = None,
    timeout_s: float = 90,
    port: int | None = None,
) -> Iterator[str]:
    """``mlflow server`` (one worker) on loopback; yields its tracking URI.

    ``port``: a given one, so that a server stopped mid-test can be started again where its
    clients look for it (same port, same backend); by default a free one.
    """
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, **TEST_CREDENTIALS}
    if s3_endpoint:
        env["MLFLOW_S3_ENDPOINT_URL"] = s3_endpoint
    args = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        backend_uri,
        "--default-artifact-root",
        artifact_root,
        "--no-serve-artifacts",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]

    def ready() -> bool:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return response.status == 200

    with _process(args, env, ready, "mlflow server", timeout_s):
        yield url
