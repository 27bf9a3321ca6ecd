"""Canary rollouts end to end: a real ``mlflow server`` whose store is S3 on loopback (moto),
publish and pull through the command line, the watcher's looks on simulated telemetry (the
decision's input, built as the Prometheus readers would return it; no exporter runs here).

One tenant, ``chat``, whose rollout policy is a 5 % canary. Version 1 goes direct; each later
version starts as ``canary-chat`` and is promoted or rolled back by the watcher; after every move
the aliases, the signed records and the bytes a ``--channel`` pull installs are checked. Then a
replayed older record is refused, and a watcher killed (-9) between its record and its alias move
leaves a state that the next run completes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient

from quantgate.config import RolloutPolicy
from quantgate.publish import RegistryConfig
from quantgate.rollout import live_to_json, watch_once
from quantgate.rollout import simulate as sim
from support.artifacts import MODEL
from support.cli import quantgate
from support.rollout import NAME, TARGET, aliases, publish_version, records, rollout_registry

pytestmark = pytest.mark.integration

GATES = """
tenants:
  chat:
    confidence: 0.95
    rollout:
      strategy: canary
      share: 0.05
      minimum: {requests: 20000, replay_pairs: 100}
      live: {max_p99_increase: 0.05, max_error_rate_increase: 0.005}
      replay: {min_top1_agreement: 0.9}
"""
BUCKETS = sim.geometric_buckets(0.005, 30.0, 1.02)
SHAPE = sim.Shape("lognormal", 0.5)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """(environment, project root): moto S3, an mlflow server, keys, gates.yaml with the policy."""
    with rollout_registry(tmp_path_factory.mktemp("rollout"), GATES) as found:
        yield found.env, found.root


def _publish(env, root: Path, tmp: Path, n: int) -> tuple[str, bytes]:
    return publish_version(env, root, tmp, n)


def _pull(env, root: Path, cache: Path, channel: str):
    return quantgate(
        "pull",
        MODEL,
        "--target",
        TARGET,
        "--tenant",
        "chat",
        "--channel",
        channel,
        "--cache-dir",
        str(cache),
        "--root",
        str(root),
        env=env,
    )


def _pulled_weights(env, root, cache, channel) -> bytes:
    done = _pull(env, root, cache, channel)
    assert done.returncode == 0, done.stderr[-3000:]
    return (Path(done.stdout.strip().splitlines()[-1]) / "model.safetensors").read_bytes()


def _run_status(env, root, cache):
    """`quantgate rollout status --json` for the chat tenant, as a router calls it."""
    return quantgate(
        "rollout",
        "status",
        MODEL,
        "--target",
        TARGET,
        "--tenant",
        "chat",
        "--json",
        "--cache-dir",
        str(cache),
        "--root",
        str(root),
        env=env,
    )


def _status(env, root, cache) -> dict:
    done = _run_status(env, root, cache)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@dataclass
class Simulated:
    """An evidence source: each look adds a batch of requests to both versions (and replay pairs)."""

    slower: float = 1.0
    canary_errors: float = 0.01
    agreement: float = 0.97
    seed: int = 0

    def __post_init__(self):
        self.rng = np.random.default_rng(self.seed)
        self.stable = self.canary = None
        self.looks = 0

    def read_live(self, model, target, tenant):
        self.looks += 1
        self.stable = sim.accumulate(self.stable, sim.telemetry(self.rng, "s", 400_000, SHAPE, BUCKETS, 0.01))
        self.canary = sim.accumulate(
            self.canary, sim.telemetry(self.rng, "c", 20_000, SHAPE, BUCKETS, self.canary_errors, self.slower)
        )
        return sim.live(self.stable, self.canary, f"look-{self.looks}")

    def read_replay(self, model, target, tenant):
        return sim.replay(np.random.default_rng(self.seed), 60 * self.looks, self.agreement, 0.8, 0.01)


def _policy(root: Path) -> tuple[RolloutPolicy, float]:
    from quantgate.config import load_rollout

    return load_rollout(root / "gates.yaml")["chat"]


def _watch_until_decided(root: Path, source: Simulated, max_looks: int = 30):
    policy, confidence = _policy(root)
    cfg = RegistryConfig.from_env(root)
    for _ in range(max_looks):
        outcome = watch_once(cfg, MODEL, TARGET, "chat", policy, confidence, source)
        if outcome.action != "continue":
            return outcome
    raise AssertionError(f"undecided after {max_looks} looks: {outcome.reason}")


_records, _aliases = records, aliases


def test_canaries_promoted_and_rolled_back_on_live_and_replay_evidence(fleet, tmp_path):
    env, root = fleet
    cache = tmp_path / "node"
    v1, w1 = _publish(env, root, tmp_path, 1)
    assert _aliases() == {"approved-chat": v1}  # the first release goes direct
    v2, w2 = _publish(env, root, tmp_path, 2)
    assert _aliases() == {"approved-chat": v1, "canary-chat": v2}
    started = _records("canary")
    assert (started["event"], started["version"], started["share"]) == ("canary-started", v2, 0.05)
    status = _status(env, root, cache)
    assert status["shares"] == {v1: pytest.approx(0.95), v2: pytest.approx(0.05)}
    assert _pulled_weights(env, root, cache, "stable") == w1
    assert _pulled_weights(env, root, cache, "canary") == w2
    old_stable = {k: v for k, v in MlflowClient().get_registered_model(NAME).tags.items() if ".stable." in k}

    # a good canary: promoted
    outcome = _watch_until_decided(root, Simulated(seed=1))
    assert outcome.action == "promote", outcome.reason
    assert _aliases() == {"approved-chat": v2}
    assert (_records("stable")["event"], _records("stable")["version"]) == ("canary-promoted", v2)
    assert (_records("canary")["event"], _records("canary")["version"]) == ("canary-promoted", None)
    assert _pulled_weights(env, root, cache, "stable") == w2
    assert _pull(env, root, cache, "canary").returncode == 2  # no canary runs
    assert _status(env, root, cache)["shares"] == {v2: 1.0}

    # +15 % p99 TTFT, +1 % errors, replay agreement below its floor: each rolled back
    for n, source, floor in (
        (3, Simulated(slower=1.15, seed=3), "p99 ttft"),
        (4, Simulated(canary_errors=0.02, seed=4), "error rate"),
        (5, Simulated(agreement=0.8, seed=5), "replay top-1 agreement"),
    ):
        version, weights = _publish(env, root, tmp_path, n)
        assert _aliases() == {"approved-chat": v2, "canary-chat": version}
        assert _pulled_weights(env, root, cache, "canary") == weights
        outcome = _watch_until_decided(root, source)
        assert outcome.action == "rollback", (n, outcome.reason)
        assert floor in outcome.reason, outcome.reason
        assert _aliases() == {"approved-chat": v2}
        assert (_records("canary")["event"], _records("canary")["version"]) == ("canary-rolled-back", None)
        assert _records("stable")["version"] == v2
        assert _pulled_weights(env, root, cache, "stable") == w2

    # someone with registry access puts back version 1's stable record and alias: refused
    client = MlflowClient()
    for key, value in old_stable.items():
        client.set_registered_model_tag(NAME, key, value)
    client.set_registered_model_alias(NAME, "approved-chat", v1)
    before = sorted(p.name for p in (cache / "pull").iterdir())
    refused = _pull(env, root, cache, "stable")
    assert refused.returncode == 2 and "older than" in refused.stderr, refused.stderr[-2000:]
    assert sorted(p.name for p in (cache / "pull").iterdir()) == before  # nothing installed
    status = _run_status(env, root, cache)
    assert status.returncode == 2 and "older than" in status.stderr, status.stderr[-2000:]


def test_a_watcher_killed_between_record_and_alias_move_is_completed_by_the_next_run(fleet, tmp_path):
    env, root = fleet
    if "approved-chat" not in _aliases():  # run alone: a stable version first
        _publish(env, root, tmp_path, 10)
    version, _ = _publish(env, root, tmp_path, 11)
    assert _aliases()["canary-chat"] == version
    source = Simulated(canary_errors=0.03, seed=11)  # one look is enough to roll it back
    live = tmp_path / "live.json"
    live.write_text(live_to_json(source.read_live(MODEL, TARGET, "chat")))
    args = [
        sys.executable,
        "-m",
        "quantgate.cli",
        "rollout",
        "watch",
        MODEL,
        "--target",
        TARGET,
        "--tenant",
        "chat",
        "--live",
        str(live),
        "--root",
        str(root),
    ]
    watcher = subprocess.Popen(
        args,
        env={**os.environ, **env, "QUANTGATE_ROLLOUT_PAUSE_AFTER_RECORD": "120"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = watcher.stdout.readline()
    assert "recorded (canary-rolled-back)" in line, (line, watcher.stderr.read() if watcher.poll() else "")
    os.kill(watcher.pid, signal.SIGKILL)
    watcher.wait(timeout=30)
    # killed: the record is the rollback, the alias still points at the canary, the move pending
    assert _records("canary")["event"] == "canary-rolled-back"
    assert _aliases()["canary-chat"] == version
    state = json.loads(MlflowClient().get_registered_model(NAME).tags["quantgate.rollout.chat"])
    assert state["pending"]["action"] == "rollback"
    sequence = _records("canary")["sequence"]
    rerun = quantgate(
        "rollout",
        "watch",
        MODEL,
        "--target",
        TARGET,
        "--tenant",
        "chat",
        "--live",
        str(live),
        "--root",
        str(root),
        env=env,
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    done = json.loads(rerun.stdout)
    assert (done["action"], done["finished_pending"]) == ("rollback", True)
    assert "canary-chat" not in _aliases()
    assert _records("canary")["sequence"] == sequence  # the record was not issued twice
    state = json.loads(MlflowClient().get_registered_model(NAME).tags["quantgate.rollout.chat"])
    assert "pending" not in state and state["outcome"]["action"] == "rollback"
    again = quantgate(
        "rollout",
        "watch",
        MODEL,
        "--target",
        TARGET,
        "--tenant",
        "chat",
        "--live",
        str(live),
        "--root",
        str(root),
        env=env,
    )
    assert json.loads(again.stdout)["action"] == "idle"  # idempotent: nothing more to do
