"""The canary watcher end to end on real telemetry: ``quantgate rollout watch`` (the command line, a
process per look, as the scheduled flow runs it) reads a real Prometheus (Debian's ``prometheus``)
that scrapes exporter processes standing in for vLLM replicas (``support/vllm_exporter.py``: vLLM's
metric names and labels, simulated traffic), request logs in the S3 store, and a replay file that
``quantgate replay`` wrote from two real llama.cpp servers; it decides, and moves aliases and signed
records in a real ``mlflow server`` on moto S3.

- tenant ``chat`` (live floors only): a good canary is promoted; one with p99 TTFT (and ITL) 15 %
  slower is rolled back; one that aborts 2 % of its requests (stable 1 %, tolerance 0.5 points) is
  rolled back on its error rate;
- tenant ``ops``: the same looks taken by the Prefect flow ``canary_watch`` (flow runs on an
  ephemeral Prefect API, as a scheduled deployment's worker runs them): a good canary promoted, each
  look's decision a Markdown artifact;
- tenant ``assist`` (a replay floor too): a canary served by the default model's GGUF requantized
  (Q4_1 -> Q4_0) agrees with stable below the floor on replayed prompts, and is rolled back.

Traffic per look is large (simulated: tens of thousands of requests a second) and the policies'
minimum evidence small, so each decision takes a few looks. The replay file is read whole at every
look and its pairs are tested once: 24 short prompts are enough evidence against a 0.9 floor when
the canary agrees about half the time, as Q4_0 does here (12 were not).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from support.artifacts import MODEL
from support.cli import quantgate
from support.rollout import TARGET, aliases, publish_version, records, rollout_registry
from support.servers import S3Endpoint
from tests.support.serving_engines import (
    llama_cpp_missing,
    llama_server,
    prometheus,
    prometheus_missing,
    requantized,
    vllm_exporter,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(prometheus_missing() is not None, reason=str(prometheus_missing())),
]

GATES = """
tenants:
  chat: &live_only
    confidence: 0.95
    rollout:
      strategy: canary
      share: 0.05
      minimum: {requests: 50000, replay_pairs: 0}
      live: {max_p99_increase: 0.05, max_error_rate_increase: 0.005}
  assist:
    confidence: 0.95
    rollout:
      strategy: canary
      share: 0.05
      minimum: {requests: 50000, replay_pairs: 8}
      live: {max_p99_increase: 0.05, max_error_rate_increase: 0.005}
      replay: {min_top1_agreement: 0.9}
  ops: *live_only  # chat's policy, watched by the Prefect flow
"""
STABLE_RATE = 190_000  # simulated requests a second, per stable replica (two of them)
CANARY_RATE = 20_000  # one canary replica: 5 % of the traffic
PROMPTS = [
    "The capital of France is",
    "Write a Python function that returns the square of a number.\n",
    "Q: What is 17 plus 25?\nA:",
    "List three colours of the rainbow:",
    "Summarise in one sentence: the meeting moved the release to Friday because tests failed.",
    "Translate to French: good morning",
    "def fibonacci(n):",
    "The three primary colours are",
    "Q: Name a planet in the solar system.\nA:",
    "Once upon a time, in a small village,",
    "Explain what a CPU does in one sentence.",
    "The opposite of hot is",
    "Q: How many days are in a week?\nA:",
    "A haiku about the sea:\n",
    "import numpy as np\n# compute the mean of a list\n",
    "The largest ocean on Earth is",
    "Give a synonym for happy:",
    "Q: What is 9 times 7?\nA:",
    "Dear team, the deployment is",
    "SELECT name FROM users WHERE",
    "The chemical symbol for gold is",
    "Three tips for better sleep:\n1.",
    "In 1969, astronauts",
    "Convert 5 kilometres to metres:",
]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    with rollout_registry(tmp_path_factory.mktemp("rollout-live"), GATES) as found:
        yield found


def _telemetry(stable: str, canary: str, **canary_traffic):
    """Two stable replicas and one canary exporting vLLM-named metrics, scraped by Prometheus;
    yields the Prometheus URL once both versions' series are there."""
    stack = ExitStack()
    targets = [
        stack.enter_context(vllm_exporter(MODEL, stable, rate=STABLE_RATE, seed=seed)) for seed in (1, 2)
    ]
    targets.append(
        stack.enter_context(vllm_exporter(MODEL, canary, rate=CANARY_RATE, seed=3, **canary_traffic))
    )
    url = stack.enter_context(prometheus(targets))
    _wait_for_series(url, stable, canary)
    return stack, url


def _wait_for_series(url: str, stable: str, canary: str, timeout_s: float = 60) -> None:
    from quantgate.rollout.evidence import MissingSeriesError, TelemetrySettings, read_live

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            read_live(TelemetrySettings(prometheus_url=url), MODEL, stable, canary)
            return
        except MissingSeriesError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _watch_until_decided(env, root: Path, tenant: str, *source: str, max_looks: int = 15) -> dict:
    """``quantgate rollout watch`` once a second until it acts; its last outcome."""
    for _ in range(max_looks):
        done = quantgate(
            "rollout",
            "watch",
            MODEL,
            "--target",
            TARGET,
            "--tenant",
            tenant,
            *source,
            "--root",
            str(root),
            env=env,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        outcome = json.loads(done.stdout.strip().splitlines()[-1])
        if outcome["action"] != "continue":
            return outcome
        time.sleep(1)
    raise AssertionError(f"undecided after {max_looks} looks: {outcome['reason']}")


def _own(tenant: str) -> dict[str, str]:
    return {a: v for a, v in aliases().items() if a.endswith(f"-{tenant}")}


def test_watch_reads_prometheus_over_exporters_standing_in_for_vllm(fleet, tmp_path):
    env, root, bucket = fleet
    v1, _ = publish_version(env, root, tmp_path, 1)
    v2, _ = publish_version(env, root, tmp_path, 2)
    assert _own("chat") == {"approved-chat": v1, "canary-chat": v2}
    # request logs in the artifact store: their errors count beside the engine's aborts
    log = "".join(
        json.dumps({"id": f"r{i}", "version": v, "class": "chat", "prompt": "hi", "status": s}) + "\n"
        for i, (v, s) in enumerate([(v1, "ok"), (v2, "error"), (v2, "abort"), (v2, "ok"), (v1, "error")])
    )
    S3Endpoint(env["MLFLOW_S3_ENDPOINT_URL"], bucket).client().put_object(
        Bucket=bucket, Key="logs/requests.jsonl", Body=log.encode()
    )
    logs = ["--logs", f"s3://{bucket}/logs/requests.jsonl"]

    # a good canary: promoted
    stack, url = _telemetry(v1, v2)
    with stack:
        from quantgate.publish import RegistryConfig
        from quantgate.rollout import SourceOptions, evidence_source

        source = evidence_source(
            root, RegistryConfig.from_env(root), SourceOptions(prometheus=url, logs=(logs[1],))
        )
        assert source.versions(MODEL, TARGET, "chat") == (v1, v2)
        assert source.log_errors() == {v2: 2, v1: 1}
        outcome = _watch_until_decided(env, root, "chat", "--prometheus", url, *logs)
    assert outcome["action"] == "promote", outcome["reason"]
    assert outcome["decision"]["canary_requests"] >= 50_000
    assert _own("chat") == {"approved-chat": v2}
    assert (records("stable")["event"], records("stable")["version"]) == ("canary-promoted", v2)
    assert (records("canary")["event"], records("canary")["version"]) == ("canary-promoted", None)
    assert records("stable")["evidence_sha256"] == records("canary")["evidence_sha256"]

    # p99 TTFT 15 % worse: rolled back
    v3, _ = publish_version(env, root, tmp_path, 3)
    assert _own("chat") == {"approved-chat": v2, "canary-chat": v3}
    stack, url = _telemetry(v2, v3, slower=1.15)
    with stack:
        outcome = _watch_until_decided(env, root, "chat", "--prometheus", url)
    assert outcome["action"] == "rollback", outcome["reason"]
    assert "p99 ttft fails its floor" in outcome["reason"]
    assert _own("chat") == {"approved-chat": v2}
    assert (records("canary")["event"], records("canary")["version"]) == ("canary-rolled-back", None)
    assert (records("stable")["event"], records("stable")["version"]) == ("canary-promoted", v2)

    # one point more of aborted requests (2 % against stable's 1 %, tolerance 0.5 points): rolled back
    v4, _ = publish_version(env, root, tmp_path, 4)
    assert _own("chat") == {"approved-chat": v2, "canary-chat": v4}
    stack, url = _telemetry(v2, v4, error_rate=0.02)
    with stack:
        outcome = _watch_until_decided(env, root, "chat", "--prometheus", url)
    assert outcome["action"] == "rollback", outcome["reason"]
    assert "error rate fails its floor" in outcome["reason"]
    assert "p99" not in outcome["reason"]
    assert _own("chat") == {"approved-chat": v2}
    assert (records("canary")["event"], records("canary")["version"]) == ("canary-rolled-back", None)


# One process takes the flow's looks, as a deployment's worker would, until one acts: the
# ephemeral Prefect API starts once. It prints each outcome and, at the end, the tenant's artifacts
# (their Markdown) and the flow runs' states as Prefect's API has them.
_FLOW_LOOKS = """
import json, sys, time
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
from quantgate.orchestrate import canary_watch

model, target, tenant, root, url = sys.argv[1:6]
for _ in range(15):
    outcome = canary_watch(model=model, target=target, tenant=tenant, root=root, prometheus=url)
    print(json.dumps({"outcome": outcome}), flush=True)
    if outcome["action"] != "continue":
        break
    time.sleep(1)
with get_client(sync_client=True) as client:
    found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["canary-" + tenant])))
    runs = client.read_flow_runs()
print(json.dumps({
    "artifacts": [a.data for a in found],
    "states": sorted({r.state.type.value for r in runs}),
    "flows": len(runs),
}))
"""


def test_the_canary_watch_flow_under_prefect_promotes_a_good_canary(fleet, tmp_path):
    env, root, _ = fleet
    o1 = _stable_version(env, root, tmp_path, "ops")
    o2, _ = publish_version(env, root, tmp_path, 42, tenants=("ops",))
    assert _own("ops") == {"approved-ops": o1, "canary-ops": o2}
    flow_env = {
        **os.environ,
        **env,
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    }
    flow_env.pop("PREFECT_API_URL", None)
    stack, url = _telemetry(o1, o2)
    with stack:
        done = subprocess.run(
            [sys.executable, "-c", _FLOW_LOOKS, MODEL, TARGET, "ops", str(root), url],
            capture_output=True, text=True, env=flow_env, timeout=600, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    outcomes, prefect_side = [x["outcome"] for x in lines[:-1]], lines[-1]
    assert outcomes[-1]["action"] == "promote", outcomes[-1]["reason"]
    assert all(o["action"] == "continue" for o in outcomes[:-1])
    assert [o["look"] for o in outcomes] == list(range(outcomes[0]["look"], outcomes[-1]["look"] + 1))
    assert _own("ops") == {"approved-ops": o2}
    assert (records("stable", "ops")["event"], records("stable", "ops")["version"]) == ("canary-promoted", o2)
    # Prefect holds each look: a completed flow run, and the decision as the tenant's artifact
    assert prefect_side["states"] == ["COMPLETED"] and prefect_side["flows"] == len(outcomes)
    assert len(prefect_side["artifacts"]) == len(outcomes)
    assert any(a.startswith("**promote**") for a in prefect_side["artifacts"])


def test_watch_name_a_missing_source(fleet):
    env, root, _ = fleet
    done = quantgate(
        "rollout", "watch", MODEL, "--target", TARGET, "--tenant", "chat", "--root", str(root), env=env
    )
    assert done.returncode == 2
    assert "no evidence source" in done.stderr and "--prometheus" in done.stderr
    both = quantgate(
        "rollout", "watch", MODEL, "--target", TARGET, "--tenant", "chat", "--live", "x.json",
        "--prometheus", "http://127.0.0.1:9", "--root", str(root), env=env,
    )  # fmt: skip
    assert both.returncode == 2 and "name one live evidence source" in both.stderr


@pytest.fixture(scope="module")
def llama_endpoints(tmp_path_factory):
    """Two llama.cpp servers: stable on the default model's GGUF, the canary on a Q4_0 of it."""
    from quantgate.embedded.smollm2 import gguf_path

    gguf = gguf_path()
    q4_0 = requantized(gguf, tmp_path_factory.mktemp("gguf") / "smollm2-q4_0.gguf")
    with llama_server(gguf) as stable, llama_server(q4_0) as canary:
        yield stable, canary


def _prompt_log(version: str) -> str:
    return "".join(
        json.dumps({"id": f"r{i}", "version": version, "class": "chat", "prompt": p, "status": "ok"}) + "\n"
        for i, p in enumerate(PROMPTS)
    )


@pytest.mark.slow
@pytest.mark.skipif(llama_cpp_missing() is not None, reason=str(llama_cpp_missing()))
def test_watch_rolls_back_a_canary_whose_llama_cpp_replay_agrees_below_its_floor(
    fleet, tmp_path, llama_endpoints
):
    env, root, _ = fleet
    a1, _ = publish_version(env, root, tmp_path, 21, tenants=("assist",))
    a2, _ = publish_version(env, root, tmp_path, 22, tenants=("assist",))
    assert _own("assist") == {"approved-assist": a1, "canary-assist": a2}
    log = tmp_path / "requests.jsonl"
    log.write_text(_prompt_log(a1))
    stable, canary = llama_endpoints
    args = ["replay", "--stable", stable, "--canary", canary, "--log", str(log), "--size", str(len(PROMPTS))]
    spec = tmp_path / "spec.yaml"
    spec.write_text(_chat_only_spec())
    done = quantgate(*args, "--spec", str(spec), "--max-tokens", "8", "--json", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    replay = tmp_path / "replay.json"
    replay.write_text(done.stdout)
    agreement = json.loads(done.stdout)["summary"]["top1_agreement"]
    assert agreement < 0.9, agreement  # the requantized canary answers differently

    stack, url = _telemetry(a1, a2)  # its live telemetry is stable's twin
    with stack:
        outcome = _watch_until_decided(env, root, "assist", "--prometheus", url, "--replay", str(replay))
    _assert_rolled_back_on_replay(outcome, a1)


@pytest.mark.slow
@pytest.mark.skipif(llama_cpp_missing() is not None, reason=str(llama_cpp_missing()))
def test_watch_itself_replays_through_llama_cpp_each_look_and_rolls_back_q4_0(
    fleet, tmp_path, llama_endpoints
):
    """No replay file: each look samples 8 new logged prompts from the request log in S3, replays
    them through both llama.cpp servers, and keeps the pairs beside the log; an unreachable
    canary endpoint stops a look (exit 75) and moves nothing."""
    env, root, bucket = fleet
    a1 = _stable_version(env, root, tmp_path, "assist")
    a2, _ = publish_version(env, root, tmp_path, 32, tenants=("assist",))
    assert _own("assist") == {"approved-assist": a1, "canary-assist": a2}
    s3 = S3Endpoint(env["MLFLOW_S3_ENDPOINT_URL"], bucket).client()
    s3.put_object(Bucket=bucket, Key="replay-logs/requests.jsonl", Body=_prompt_log(a1).encode())
    stable, canary = llama_endpoints
    logs = ["--logs", f"s3://{bucket}/replay-logs/requests.jsonl"]
    replaying = [*logs, "--replay-stable", stable, "--replay-size", "8", "--replay-max-tokens", "8"]

    stack, url = _telemetry(a1, a2)
    with stack:
        down = quantgate(
            "rollout", "watch", MODEL, "--target", TARGET, "--tenant", "assist", "--prometheus", url,
            *replaying, "--replay-canary", "http://127.0.0.1:9", "--root", str(root), env=env,
        )  # fmt: skip
        assert down.returncode == 75, down.stderr[-2000:]
        assert "127.0.0.1:9" in down.stderr and "did not answer" in down.stderr
        assert _own("assist") == {"approved-assist": a1, "canary-assist": a2}
        outcome = _watch_until_decided(
            env, root, "assist", "--prometheus", url, *replaying, "--replay-canary", canary
        )
    _assert_rolled_back_on_replay(outcome, a1)
    stored = s3.list_objects_v2(Bucket=bucket, Prefix="replay-logs/rollout-replay/")["Contents"]
    assert len(stored) == outcome["look"] >= 2  # one file a look, the failed look none
    looks = [json.loads(_object(s3, bucket, o)) for o in stored]
    hashes = [p["prompt_sha256"] for look in looks for p in look["pairs"]]
    assert len(hashes) == len(set(hashes)) == outcome["decision"]["replay_pairs"]  # a new sample a look
    assert all(len(look["pairs"]) == 8 for look in looks[:2])
    assert not any(p in b"".join(_object(s3, bucket, o) for o in stored).decode() for p in PROMPTS)


def _stable_version(env, root: Path, tmp: Path, tenant: str) -> str:
    """The tenant's stable version; when the test runs alone, its first release (which goes direct)."""
    from mlflow.exceptions import MlflowException

    try:
        found = _own(tenant).get(f"approved-{tenant}")
    except MlflowException:  # nothing published yet
        found = None
    if found is None:
        found, _ = publish_version(env, root, tmp, 30, tenants=(tenant,))
        assert _own(tenant) == {f"approved-{tenant}": found}
    return found


def _object(s3, bucket: str, listed: dict) -> bytes:
    return s3.get_object(Bucket=bucket, Key=listed["Key"])["Body"].read()


def _assert_rolled_back_on_replay(outcome: dict, stable_version: str) -> None:
    assert outcome["action"] == "rollback", outcome["reason"]
    assert "replay top-1 agreement fails its floor" in outcome["reason"]
    assert "p99" not in outcome["reason"]
    assert _own("assist") == {"approved-assist": stable_version}
    rolled = records("canary", "assist")
    assert (rolled["event"], rolled["version"]) == ("canary-rolled-back", None)
    assert records("stable", "assist")["version"] == stable_version


def _chat_only_spec() -> str:
    """A calibration spec whose traffic is all one class, so the replay sample takes every prompt."""
    from quantgate.config import project_root

    default = project_root() / "calibration_sets" / "default.yaml"
    return (
        f"version: 1\nname: chat-only\ntraffic_log: {default.parent / 'traffic' / 'default-traffic.jsonl'}\n"
        f"size: {len(PROMPTS)}\nmix: {{chat: 1.0}}\n"
        "length_buckets: [{name: any, max_chars: 100000, share: 1.0}]\n"
    )
