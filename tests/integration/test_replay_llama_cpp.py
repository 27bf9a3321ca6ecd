"""Replay through two real llama.cpp servers (the OpenAI-compatible API every engine exposes),
serving the default model's GGUF and a second quantization of it made by llama.cpp's quantizer.

Two servers on the same GGUF, each seeing the same prompts in the same order, answer identically:
agreement 1.0, KL 0. The requantized model answers differently on some prompts: a measured lower
agreement and a positive KL. Skipped only when llama-cpp-python is not importable (.ci/run builds
it from source in the background and installs it before these tests)."""

from __future__ import annotations

import json
from contextlib import ExitStack

import pytest

from tests.support.serving_engines import llama_cpp_missing, llama_server, requantized

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(llama_cpp_missing() is not None, reason=str(llama_cpp_missing())),
]

PROMPTS = [
    "The capital of France is",
    "Write a Python function that returns the square of a number.\n",
    "Q: What is 17 plus 25?\nA:",
    "List three colours of the rainbow:",
    "Summarise in one sentence: the meeting moved the release to Friday because tests failed.",
    "Translate to French: good morning",
]


@pytest.fixture(scope="module")
def endpoints(tmp_path_factory):
    from quantgate.embedded.smollm2 import gguf_path

    gguf = gguf_path()
    q4_0 = requantized(gguf, tmp_path_factory.mktemp("gguf") / "smollm2-q4_0.gguf")
    with ExitStack() as stack:
        stable = stack.enter_context(llama_server(gguf))
        twin = stack.enter_context(llama_server(gguf))
        canary = stack.enter_context(llama_server(q4_0))
        yield {"stable": stable, "twin": twin, "canary": canary}


def test_identical_endpoints_agree_fully(endpoints):
    from quantgate.rollout import ReplaySettings, replay_prompts, summary

    evidence = replay_prompts(
        PROMPTS, endpoints["stable"], endpoints["twin"], seed=0, settings=ReplaySettings(max_tokens=12)
    )
    totals = summary(evidence)
    assert totals["prompts"] == len(PROMPTS)
    assert totals["top1_agreement"] == 1.0
    assert totals["kl"] == pytest.approx(0.0, abs=1e-9)
    assert totals["exact_match"] == 1.0
    assert all(p.length_delta == 0 for p in evidence.pairs)


def test_second_quantization_agrees_less(endpoints):
    from quantgate.rollout import ReplaySettings, replay_prompts, summary

    settings = ReplaySettings(max_tokens=12)
    evidence = replay_prompts(PROMPTS, endpoints["stable"], endpoints["canary"], seed=0, settings=settings)
    totals = summary(evidence)
    assert totals["kl"] > 1e-4  # Q4_1 -> Q4_0 moves the distributions measurably
    assert totals["top1_agreement"] < 1.0 or totals["exact_match"] < 1.0
    assert 0.0 <= totals["top1_agreement"] <= 1.0


def test_cli_replay_never_writes_prompts(endpoints, tmp_path):
    from typer.testing import CliRunner

    from quantgate.cli import app

    log = tmp_path / "requests.jsonl"
    classes = ["chat", "code", "math", "long_document", "tool_call"]
    lines = [
        {"id": f"r{i}", "version": "3", "class": classes[i % 5], "prompt": p, "status": "ok"}
        for i, p in enumerate(PROMPTS * 2)
    ]
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    args = ["replay", "--stable", endpoints["stable"], "--canary", endpoints["canary"], "--log", str(log)]
    result = CliRunner().invoke(app, [*args, "--size", "3", "--max-tokens", "6", "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert body["summary"]["prompts"] == 3
    assert len(body["digest"]) == 64
    for prompt in PROMPTS:
        assert prompt not in result.output


def test_unreachable_endpoint_is_transient(endpoints):
    from quantgate.rollout import replay_prompts
    from quantgate.rollout.evidence import EvidenceUnavailableError

    with pytest.raises(EvidenceUnavailableError, match="did not answer"):
        replay_prompts(PROMPTS[:1], endpoints["stable"], "http://127.0.0.1:9", seed=0)
