"""8 fleet nodes pull one new version at once: origin egress and time to all-ready, fleet vs origin only.

Usage:  .venv/bin/python bench/fleet/fleet_pull.py [--nodes 8] [--mb 100] [--origin-mb-s 25] [--out F]

Starts a moto S3 server behind a TCP proxy that limits the bytes it sends, all connections
together, to ``--origin-mb-s`` (the origin's link, a VPC's share, against a faster peer fabric:
the nodes talk to each other over loopback unthrottled) and counts them. Publishes one
synthetic artifact (``--mb`` of shards, a real manifest, an SQLite MLflow registry). Then, in the
same run, two rounds of ``--nodes`` node processes (tests/support/fleet.py: own cache, own port),
each round with empty caches, released at the same instant:

- origin only: ``pull`` with no peers listed (today's path: every file from the store);
- fleet: ``pull`` with every node listed as a peer, then seeding what it holds until all are done.

Reported per round: bytes the origin sent (through the proxy), and seconds from the release to
the last node's verified install. Goal (issue 28): fleet origin bytes <= 1.5 x the artifact,
fleet time <= 1/2 of origin only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))


class ThrottledProxy:
    """A TCP proxy to ``upstream`` whose responses share one token bucket of ``rate`` bytes/s."""

    def __init__(self, upstream: tuple[str, int], rate: float) -> None:
        self.upstream, self.rate = upstream, rate
        self.sent = 0
        self.lock = threading.Lock()
        self.next_free = time.monotonic()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._pipe, args=(client, up, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(up, client, True), daemon=True).start()

    def _take(self, n: int) -> None:
        with self.lock:  # reserve the link for n bytes after whatever is already reserved
            start = max(self.next_free, time.monotonic())
            self.next_free = start + n / self.rate
            self.sent += n
        delay = self.next_free - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def _pipe(self, src: socket.socket, dst: socket.socket, throttled: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(64 * 1024):
                if throttled:
                    self._take(len(data))
                dst.sendall(data)
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _round(name: str, nodes: int, cfg, fleet_on: bool, work: Path, proxy: ThrottledProxy) -> dict:
    from quantgate.fleet import FleetSettings
    from support.fleet import node_process, wait_for, write_job
    from support.servers import free_port

    ports = [free_port() for _ in range(nodes)]
    peers = ",".join(f"127.0.0.1:{p}" for p in ports) if fleet_on else ""
    release = time.time() + 30 + 6 * nodes  # every process imported and waiting by then
    jobs = []
    for i, port in enumerate(ports):
        fleet = FleetSettings(peers=peers, listen=f"127.0.0.1:{port}")
        job = write_job(
            work / f"{name}-{i}.json",
            registry=cfg.model_dump_json(),
            fleet=fleet.model_dump(),
            cache=str(work / f"{name}-{i}"),
            action="pull+seed" if fleet_on else "pull",
            model="bench-model",
            target="hopper-fp8",
            tenant="chat",
            result=str(work / f"{name}-{i}.result"),
            start_at=release,
        )
        jobs.append(job)
    before = proxy.sent
    with contextlib.ExitStack() as stack:
        procs = [stack.enter_context(node_process(j, work / f"{j.stem}.log")) for j in jobs]
        results = [
            wait_for(work / f"{j.stem}.result", p, 1800, work / f"{j.stem}.log")
            for j, p in zip(jobs, procs, strict=True)
        ]
    bad = [r for r in results if r["exit_code"] != 0]
    if bad:
        raise SystemExit(f"{name}: {len(bad)} node(s) failed: {bad[0]}")
    return {
        "round": name,
        "nodes": nodes,
        "origin_bytes": proxy.sent - before,
        "seconds_to_all_ready": max(r["finished_at"] for r in results) - release,
        "slowest_node_s": max(r["seconds"] for r in results),
        "peer_bytes": sum(r.get("peer_bytes", 0) for r in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--mb", type=int, default=100, help="size of the synthetic artifact (SI MB)")
    parser.add_argument("--origin-mb-s", type=float, default=25.0, help="the origin's link, MB/s (SI)")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args()

    from pull_throughput import synthetic_artifact  # bench/fleet/ is on the path when run as a script

    from quantgate.publish import RegistryConfig, publish_report
    from quantgate.runtime.units import MB
    from support.artifacts import write_report
    from support.servers import TEST_CREDENTIALS, moto_s3

    os.environ.update(TEST_CREDENTIALS)
    with tempfile.TemporaryDirectory(prefix="quantgate-bench-fleet-") as tmp_name, moto_s3() as s3:
        tmp = Path(tmp_name)
        host, port = s3.url.removeprefix("http://").split(":")
        proxy = ThrottledProxy((host, int(port)), args.origin_mb_s * MB)
        cfg = RegistryConfig.local(tmp / "registry").model_copy(
            update={"artifact_uri": f"s3://{s3.bucket}/bench", "s3_endpoint_url": s3.url}
        )
        source = synthetic_artifact(tmp / "artifacts" / "hopper-fp8", args.mb)
        publish_report(
            write_report(tmp / "gate", {"hopper-fp8": ["chat"]}, model="bench-model"), source.parent, cfg
        )
        artifact = sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
        nodes_cfg = cfg.model_copy(update={"s3_endpoint_url": f"http://127.0.0.1:{proxy.port}"})
        rounds = [
            _round("origin-only", args.nodes, nodes_cfg, False, tmp, proxy),
            _round("fleet", args.nodes, nodes_cfg, True, tmp, proxy),
        ]
    origin, fleet = rounds
    figures = {
        "artifact_bytes": artifact,
        "origin_mb_s": args.origin_mb_s,
        "rounds": rounds,
        "fleet_origin_x_artifact": fleet["origin_bytes"] / artifact,
        "origin_only_origin_x_artifact": origin["origin_bytes"] / artifact,
        "fleet_time_over_origin_only": fleet["seconds_to_all_ready"] / origin["seconds_to_all_ready"],
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
    }
    print(json.dumps(figures, indent=1))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
