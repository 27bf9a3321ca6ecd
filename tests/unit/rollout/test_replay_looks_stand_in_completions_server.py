"""The watcher's own replay at each look (``rollout.replay_looks``): seeded by the look, one file per
look in a local store, reused when a killed look is taken again, a new sample at every look, and
no file and an exit-75 error when an endpoint does not answer.

The endpoints are a stand-in: a small HTTP server in this process answering OpenAI's
``/v1/completions`` with fixed log-probabilities (the real llama.cpp servers are in
``tests/integration/test_rollout_watch_prometheus_exporters_stand_in_for_vllm.py``); it counts the
requests, which is what shows a re-taken look asking nothing again."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from quantgate.publish import RegistryConfig
from quantgate.rollout import SourceOptions, TelemetryEvidence, evidence_source
from quantgate.rollout.evidence import EvidenceUnavailableError
from quantgate.rollout.replay import ReplaySettings
from quantgate.rollout.replay_compare import prompt_sha256
from quantgate.rollout.replay_looks import ReplayEndpoints, ReplayingEvidence, ReplayLook, replay_look
from quantgate.runtime.errors import InputError, UsageError

pytestmark = pytest.mark.unit

PROMPTS = [f"prompt number {i}" for i in range(10)]


class _Completions(BaseHTTPRequestHandler):
    """Answers every prompt with tokens "a b"; the canary's second position prefers "c"."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.asked.append(body["prompt"])
        second = {"b": -0.1, "c": -2.5} if self.server.side == "stable" else {"c": -0.1, "b": -2.5}
        answer = {
            "choices": [
                {
                    "text": "a b",
                    "logprobs": {"tokens": ["a", "b"], "top_logprobs": [{"a": -0.05, "z": -3.0}, second]},
                }
            ]
        }
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def servers():
    found = {}
    for side in ("stable", "canary"):
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Completions)
        server.side, server.asked = side, []
        threading.Thread(target=server.serve_forever, daemon=True).start()
        found[side] = server
    yield found
    for server in found.values():
        server.shutdown()
        server.server_close()


def _url(server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def setup(tmp_path, servers):
    log = tmp_path / "logs" / "requests.jsonl"
    log.parent.mkdir()
    log.write_text(
        "".join(
            json.dumps(
                {
                    "id": str(i),
                    "version": "1",
                    "class": "chat" if i % 2 else "code",
                    "prompt": p,
                    "status": "ok",
                }
            )
            + "\n"
            for i, p in enumerate(PROMPTS)
        )
    )
    endpoints = ReplayEndpoints(
        _url(servers["stable"]),
        _url(servers["canary"]),
        (str(log),),
        str(tmp_path / "store"),
        size=4,
        settings=ReplaySettings(max_tokens=2, timeout_s=5),
    )
    cfg = RegistryConfig.local(tmp_path / "registry")
    return cfg, endpoints, tmp_path / "store"


def _look(n: int, started: str = "2026-12-06T05:00:00+00:00") -> ReplayLook:
    return ReplayLook("smollm2.hopper-fp8", "assist", "7", started, n)


def test_the_seed_is_the_looks_own():
    assert _look(1).seed == _look(1).seed
    assert len({_look(1).seed, _look(2).seed, _look(1, "2026-12-07T00:00:00+00:00").seed}) == 3
    assert _look(3).rel().endswith("/assist/7-" + _look(3).run_dir()[-12:] + "/look-0003.json")


def test_a_look_taken_again_reuses_its_pairs_and_asks_nothing(setup, servers):
    cfg, endpoints, store = setup
    first, added = replay_look(cfg, endpoints, _look(1))
    assert added == 4 and len(first.pairs) == 4
    assert len(servers["stable"].asked) == len(servers["canary"].asked) == 4
    assert servers["stable"].asked == servers["canary"].asked  # the same prompts, paired
    again, added_again = replay_look(cfg, endpoints, _look(1))  # a run killed after the file, re-run
    assert again == first and added_again == 4
    assert len(servers["stable"].asked) == 4  # nothing asked again
    # the stored look holds hashes only, never a prompt
    text = next(store.rglob("look-0001.json")).read_text()
    assert not any(p in text for p in PROMPTS)
    assert {p.prompt_sha256 for p in first.pairs} <= {prompt_sha256(p) for p in PROMPTS}
    # the canary prefers another token at the second position: half the positions agree
    assert all(p.top1_agreement == 0.5 and p.kl > 0 for p in first.pairs)


def test_each_look_replays_a_new_sample_and_accumulates(setup, servers):
    cfg, endpoints, _ = setup
    one, _ = replay_look(cfg, endpoints, _look(1))
    two, added = replay_look(cfg, endpoints, _look(2))
    assert added == 4 and two.pairs[:4] == one.pairs  # looks 1..2, in order
    hashes = [p.prompt_sha256 for p in two.pairs]
    assert len(set(hashes)) == 8  # look 2 drew prompts look 1 had not replayed
    three, added = replay_look(cfg, endpoints, _look(3))
    assert added == 2 and len(three.pairs) == 10  # the pool is spent: the rest, then nothing new
    assert replay_look(cfg, endpoints, _look(4))[1] == 0
    assert len({one.digest, two.digest, three.digest}) == 3


def test_an_endpoint_that_does_not_answer_stops_the_look_and_writes_nothing(setup, servers):
    cfg, endpoints, store = setup
    servers["canary"].shutdown()
    servers["canary"].server_close()
    with pytest.raises(EvidenceUnavailableError, match="did not answer") as info:
        replay_look(cfg, endpoints, _look(1))
    assert info.value.exit_code == 75
    assert not list(store.rglob("look-*.json"))


def test_options_name_the_endpoints(tmp_path, monkeypatch):
    for name in ("QUANTGATE_PROMETHEUS_URL", "QUANTGATE_TELEMETRY_FILE"):
        monkeypatch.delenv(name, raising=False)
    cfg = RegistryConfig.local(tmp_path)
    found = evidence_source(
        tmp_path,
        cfg,
        SourceOptions(
            prometheus="http://p:9090",
            logs=("s3://b/logs/a.jsonl",),
            replay_stable="http://s:8000",
            replay_canary="http://c:8000",
            replay_size=5,
        ),
    )
    assert isinstance(found, ReplayingEvidence) and isinstance(found.live, TelemetryEvidence)
    assert found.endpoints.prompts == ("s3://b/logs/a.jsonl",)  # the logs the watcher reads
    assert found.endpoints.store == cfg.artifact_uri and found.endpoints.size == 5


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"replay_stable": "http://s:8000"}, "--replay-canary"),
        ({"replay_stable": "http://s", "replay_canary": "http://c"}, "no prompts to replay"),
        ({"replay_prompts": ("l.jsonl",)}, "without --replay-stable"),
        (
            {
                "replay_stable": "http://s",
                "replay_canary": "http://c",
                "logs": ("l.jsonl",),
                "replay": "r.json",
            },
            "replay from a file or from endpoints",
        ),
        (
            {
                "replay_stable": "http://s",
                "replay_canary": "http://c",
                "logs": ("l.jsonl",),
                "replay_store": "gs://b",
            },
            "neither a local folder nor s3",
        ),
    ],
)
def test_replay_options_that_make_no_sense_are_refused(tmp_path, options, message):
    with pytest.raises(UsageError, match=message):
        evidence_source(tmp_path, None, SourceOptions(prometheus="http://p:9090", **options))


def test_a_stored_look_that_was_changed_is_refused(setup):
    cfg, endpoints, store = setup
    replay_look(cfg, endpoints, _look(1))
    file = next(store.rglob("look-0001.json"))
    data = json.loads(file.read_text())
    data["pairs"][0]["top1_agreement"] = 1.0  # a better canary, written in afterwards
    file.write_text(json.dumps(data))
    with pytest.raises(InputError, match="does not match its digest") as info:
        replay_look(cfg, endpoints, _look(2))
    assert "look-0001.json" in str(info.value) and info.value.exit_code == 2
