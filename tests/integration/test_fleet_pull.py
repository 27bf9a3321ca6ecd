"""The fleet as the CDN (issue 28), with faults: nodes are processes on loopback, each with its
own cache and port (support.fleet), the origin a real moto S3 server, the registry a real SQLite
MLflow; peers that freeze (issue 44) are a real `quantgate seed` stopped with SIGSTOP and raw
peers that handshake as seeds and then say nothing or lie (support.fleet.RawPeer). Every wait
is bounded; nothing here measures speed (bench/fleet/fleet_pull.py does)."""

from __future__ import annotations

import contextlib
import filecmp
import os
import signal
import time
from pathlib import Path

import pytest

from quantgate.fleet import FleetSettings
from quantgate.publish import RegistryConfig, publish_report, pull
from quantgate.publish.cache import PullCache
from quantgate.publish.config import TransferSettings
from support.artifacts import MODEL, write_artifact, write_report
from support.fleet import PeerProxy, RawPeer, node_process, seed_process, wait_for, write_job
from support.servers import TEST_CREDENTIALS, free_port, moto_s3

pytestmark = pytest.mark.integration

TIMEOUT_S = 120  # any one wait: a bound, not a measurement
FILES = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"]}',
    "model-00001-of-00003.safetensors": os.urandom(5_000_000),
    "model-00002-of-00003.safetensors": os.urandom(5_000_000),
    "model-00003-of-00003.safetensors": os.urandom(2_000_000),
}


@pytest.fixture
def fleet(tmp_path, monkeypatch):
    """(registry config, published artifact dir, exit stack holding the S3 server)."""
    for key, value in TEST_CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    with contextlib.ExitStack() as stack:
        s3 = stack.enter_context(moto_s3())
        cfg = RegistryConfig.local(tmp_path / "registry").model_copy(
            update={
                "artifact_uri": f"s3://{s3.bucket}/fleet",
                "s3_endpoint_url": s3.url,
                "transfer": TransferSettings(max_attempts=1, connect_timeout_s=1, read_timeout_s=5),
            }
        )
        source = write_artifact(tmp_path / "artifacts" / "hopper-fp8", "hopper-fp8", FILES)
        publish_report(write_report(tmp_path / "gate", {"hopper-fp8": ["chat"]}), source.parent, cfg)
        yield cfg, source, stack


def _job(
    tmp_path: Path, name: str, cfg: RegistryConfig, fleet: FleetSettings, action: str
) -> tuple[Path, Path, Path]:
    job = write_job(
        tmp_path / f"{name}.json",
        registry=cfg.model_dump_json(),
        fleet=fleet.model_dump(),
        cache=str(tmp_path / name),
        action=action,
        model=MODEL,
        target="hopper-fp8",
        tenant="chat",
        result=str(tmp_path / f"{name}.result"),
        ready=str(tmp_path / f"{name}.ready"),
    )
    return job, tmp_path / f"{name}.result", tmp_path / f"{name}.ready"


def _same(source: Path, path: Path) -> bool:
    return all(filecmp.cmp(source / rel, Path(path) / rel, shallow=False) for rel in FILES)


def _record(path: Path) -> dict:
    return PullCache(Path(path).parent, 10**12).record(Path(path).name) or {}


def test_a_peer_flipping_bytes_is_caught_and_the_pieces_fetched_again(fleet, tmp_path):
    cfg, source, _ = fleet
    port = free_port()
    seeder = FleetSettings(listen=f"127.0.0.1:{port}")
    job, _, ready = _job(tmp_path, "a", cfg, seeder, "pull+seed")
    with node_process(job, tmp_path / "a.log") as proc:
        wait_for(ready, proc, TIMEOUT_S, tmp_path / "a.log")
        liar = PeerProxy(("127.0.0.1", port), flip=True)  # the only peer node b knows
        try:
            b = FleetSettings(peers=f"127.0.0.1:{liar.port}", listen=f"127.0.0.1:{free_port()}")
            path = pull(
                MODEL, "hopper-fp8", "chat", cfg.model_copy(update={"fleet": b}), cache_dir=tmp_path / "b"
            )
        finally:
            liar.close()
    assert liar.flipped > 0
    record = _record(path)
    assert int(record["bad_pieces"]) > 0  # caught by the merkle check, refetched, and then
    assert _same(source, path)  # every file re-hashed against the signed manifest before install


def _wait_until_sent(proxy: PeerProxy, size: int, result: Path) -> None:
    """Until the seeder has sent ``size`` block bytes through ``proxy`` (or the pull ended)."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline and not result.exists() and proxy.block_bytes < size:
        time.sleep(0.05)


def test_a_seeding_peer_killed_mid_transfer_costs_only_time(fleet, tmp_path):
    cfg, source, _ = fleet
    port = free_port()
    slow = FleetSettings(listen=f"127.0.0.1:{port}", upload_mb_s=1.0)
    job, _, ready = _job(tmp_path, "a", cfg, slow, "pull+seed")
    with node_process(job, tmp_path / "a.log") as seeder:
        wait_for(ready, seeder, TIMEOUT_S, tmp_path / "a.log")
        wire = PeerProxy(("127.0.0.1", port))  # node b's only peer: what the seeder sent, counted
        b = FleetSettings(peers=f"127.0.0.1:{wire.port}", listen=f"127.0.0.1:{free_port()}")
        b_job, b_result, _ = _job(tmp_path, "b", cfg, b, "pull")
        try:
            with node_process(b_job, tmp_path / "b.log") as puller:
                _wait_until_sent(wire, 1_000_000, b_result)
                os.killpg(seeder.pid, signal.SIGKILL)
                done = wait_for(b_result, puller, TIMEOUT_S, tmp_path / "b.log")
        finally:
            wire.close()
    print("DEBUG", done, wire.block_bytes)
    assert done["exit_code"] == 0, done
    assert 0 < done["peer_bytes"] < sum(len(v) for v in FILES.values())  # the seeder died mid-way
    assert done["origin_bytes"] > 0  # the origin sent the rest
    assert _same(source, done["path"])


def test_origin_stopped_after_one_node_finished_the_others_complete_from_peers(fleet, tmp_path):
    cfg, source, stack = fleet
    ports = [free_port() for _ in range(3)]
    peers = ",".join(f"127.0.0.1:{p}" for p in ports)
    jobs = [
        _job(tmp_path, name, cfg, FleetSettings(peers=peers, listen=f"127.0.0.1:{port}"), "pull+seed")
        for name, port in zip("abc", ports, strict=True)
    ]
    with contextlib.ExitStack() as nodes:
        first = nodes.enter_context(node_process(jobs[0][0], tmp_path / "a.log"))
        wait_for(jobs[0][2], first, TIMEOUT_S, tmp_path / "a.log")  # a pulled and seeds
        stack.close()  # the S3 server is gone
        others = [
            nodes.enter_context(node_process(job, tmp_path / f"{n}.log"))
            for n, (job, _, _) in zip("bc", jobs[1:], strict=True)
        ]
        results = [
            wait_for(r, p, TIMEOUT_S, tmp_path / f"{n}.log")
            for n, (_, r, _), p in zip("bc", jobs[1:], others, strict=True)
        ]
    for done in results:
        assert done["exit_code"] == 0, done
        assert done["origin_bytes"] == 0 and done["peer_bytes"] >= sum(len(v) for v in FILES.values())
        assert _same(source, done["path"])


# -- peers that stall (issue 44): a speed-up, never a dependency -----------------------------------
STALL_S = 30  # the pull's own no-byte limit: before the deadlines, a frozen peer ended it here, exit 75


def _seeding_node(fleet, tmp_path: Path, name: str, **env: str):
    """A cache holding the version (a pull with no peers), then ``quantgate seed`` serving it."""
    cfg, _, _ = fleet
    pull(MODEL, "hopper-fp8", "chat", cfg, cache_dir=tmp_path / name)
    port = free_port()
    proc = seed_process(
        tmp_path / name, tmp_path / "project", f"127.0.0.1:{port}", tmp_path / f"{name}.log", **env
    )
    return proc, port


def test_a_seeder_frozen_by_sigstop_mid_transfer_costs_only_time(fleet, tmp_path):
    cfg, source, _ = fleet
    (tmp_path / "project").mkdir()
    seeding, port = _seeding_node(fleet, tmp_path, "a", QUANTGATE_FLEET_UPLOAD_MB_S="1")
    with seeding as seeder:
        wire = PeerProxy(("127.0.0.1", port))  # forwards and counts; it never closes a connection
        b = FleetSettings(peers=f"127.0.0.1:{wire.port}", listen=f"127.0.0.1:{free_port()}", stall_s=STALL_S)
        b_job, b_result, _ = _job(tmp_path, "b", cfg, b, "pull")
        try:
            with node_process(b_job, tmp_path / "b.log") as puller:
                _wait_until_sent(wire, 1_000_000, b_result)
                os.killpg(seeder.pid, signal.SIGSTOP)  # a hung disk, a GC pause: the socket stays open
                done = wait_for(b_result, puller, TIMEOUT_S, tmp_path / "b.log")
        finally:
            wire.close()
    print("DEBUG", done, wire.block_bytes)
    assert done["exit_code"] == 0, done
    assert 0 < done["peer_bytes"] < sum(len(v) for v in FILES.values())  # frozen mid-way
    assert done["origin_bytes"] > 0  # the origin sent the rest, before the stall limit
    assert _same(source, done["path"])


def test_silent_frozen_and_garbage_peers_listed_with_the_origin_up_the_pull_completes(fleet, tmp_path):
    """The issue's case: one peer that handshakes as a seed and never sends, one `quantgate seed`
    stopped (SIGSTOP) before the pull starts, one that answers every request with random bytes."""
    cfg, source, _ = fleet
    (tmp_path / "project").mkdir()
    alone_job, alone_result, _ = _job(tmp_path, "c", cfg, FleetSettings(), "pull")  # the origin alone
    with node_process(alone_job, tmp_path / "c.log") as alone:
        control = wait_for(alone_result, alone, TIMEOUT_S, tmp_path / "c.log")
    silent, garbage = RawPeer("silent"), RawPeer("garbage")
    seeding, port = _seeding_node(fleet, tmp_path, "a")
    try:
        with seeding as seeder:
            os.killpg(seeder.pid, signal.SIGSTOP)
            peers = f"127.0.0.1:{silent.port},127.0.0.1:{port},127.0.0.1:{garbage.port}"
            b = FleetSettings(peers=peers, listen=f"127.0.0.1:{free_port()}", stall_s=STALL_S)
            b_job, b_result, _ = _job(tmp_path, "b", cfg, b, "pull")
            with node_process(b_job, tmp_path / "b.log") as puller:
                done = wait_for(b_result, puller, TIMEOUT_S, tmp_path / "b.log")
    finally:
        silent.close()
        garbage.close()
    print(  # the figures the issue asks for (pytest -rP shows them)
        f"silent+frozen+garbage peers, origin up: exit {done['exit_code']} in {done['seconds']:.1f} s, "
        f"{done.get('peer_bytes', 0):,} bytes from peers, {done.get('origin_bytes', 0):,} from the origin; "
        f"silent peer asked {silent.requests} block(s), garbage peer {garbage.requests}; "
        f"the same pull with no peer listed: {control['seconds']:.1f} s"
    )
    assert done["exit_code"] == 0, done
    assert silent.requests > 0 and garbage.requests > 0  # each was asked, and none was waited for
    assert done["origin_bytes"] >= sum(len(v) for v in FILES.values())
    assert _same(source, done["path"])
