"""Canary replay: the same prompts through the stable and the canary endpoints, compared paired.

Every serving engine (vLLM, llama.cpp's server, TGI) exposes OpenAI's ``/v1/completions``; each
prompt goes to both at temperature 0 with ``logprobs`` top-k, one after the other (the two answers
of a pair are compared, never two runs of one side). This measures the engine on its own hardware,
which quantgate's evaluation numerics only emulate. The result keeps only each prompt's sha256.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import httpx

from quantgate.rollout.evidence import (
    EvidenceFormatError,
    EvidenceUnavailableError,
    ReplayEvidence,
    evidence_digest,
)
from quantgate.rollout.replay_compare import Completion, compare


@dataclass(frozen=True)
class ReplaySettings:
    """How each prompt is asked: greedy, with ``top_logprobs`` alternatives per position."""

    max_tokens: int = 32
    top_logprobs: int = 5
    model: str | None = None  # the served model's name, where the engine checks it (vLLM does)
    timeout_s: float = 120.0


def completions_url(endpoint: str) -> str:
    """``endpoint`` may be the server's root or its ``/v1``."""
    base = endpoint.rstrip("/")
    return f"{base}/completions" if base.endswith("/v1") else f"{base}/v1/completions"


def _parse(url: str, body: Any) -> Completion:
    """The first choice of an OpenAI completions answer, with its legacy ``logprobs`` block."""
    fix = "point the endpoint at an OpenAI-compatible server that returns logprobs for /v1/completions"
    try:
        choice = body["choices"][0]
        logprobs = choice["logprobs"]
        tokens = tuple(str(t) for t in logprobs["tokens"])
        tops = tuple({str(k): float(v) for k, v in (top or {}).items()} for top in logprobs["top_logprobs"])
        text = str(choice["text"])
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise EvidenceFormatError(
            url, f"the answer has no usable choices[0].logprobs ({exc!r})", fix
        ) from None
    return Completion(text=text, tokens=tokens, top_logprobs=tops)


def complete(client: httpx.Client, endpoint: str, prompt: str, settings: ReplaySettings) -> Completion:
    """One greedy completion with top-k log-probabilities from ``endpoint``."""
    url = completions_url(endpoint)
    payload: dict[str, Any] = {
        "prompt": prompt,
        "max_tokens": settings.max_tokens,
        "temperature": 0,
        "logprobs": settings.top_logprobs,
        "seed": 0,
    }
    if settings.model:
        payload["model"] = settings.model
    try:
        response = client.post(url, json=payload, timeout=settings.timeout_s)
    except httpx.HTTPError as exc:
        raise EvidenceUnavailableError(
            url,
            f"the endpoint did not answer ({type(exc).__name__}: {exc})",
            "check the URL and that the server runs",
        ) from None
    if response.status_code >= 500:
        raise EvidenceUnavailableError(
            url, f"HTTP {response.status_code}", "retry when the server is healthy"
        )
    if response.status_code != 200:
        raise EvidenceFormatError(
            url, f"HTTP {response.status_code}: {response.text[:200]}", "check --model and the endpoint URL"
        )
    try:
        return _parse(url, response.json())
    except ValueError:
        raise EvidenceFormatError(
            url, "the answer is not JSON", "point the endpoint at the server's root"
        ) from None


def replay_prompts(
    prompts: Sequence[str],
    stable: str,
    canary: str,
    seed: int,
    settings: ReplaySettings | None = None,
    client: httpx.Client | None = None,
) -> ReplayEvidence:
    """Each prompt through both endpoints, compared paired; ``seed`` is the sample's, recorded."""
    settings = settings or ReplaySettings()
    own = client is None
    client = client or httpx.Client()
    try:
        pairs = tuple(
            compare(p, complete(client, stable, p, settings), complete(client, canary, p, settings))
            for p in prompts
        )
    finally:
        if own:
            client.close()
    unsigned = ReplayEvidence(
        stable_endpoint=stable, canary_endpoint=canary, seed=seed, pairs=pairs, digest=""
    )
    return replace(unsigned, digest=evidence_digest(unsigned))


def summary(evidence: ReplayEvidence) -> dict[str, float | int]:
    """The pairs' means: what the summary table and a replay floor read."""
    pairs = evidence.pairs
    n = len(pairs)
    if not n:
        return {"prompts": 0}
    return {
        "prompts": n,
        "top1_agreement": sum(p.top1_agreement for p in pairs) / n,
        "kl": sum(p.kl for p in pairs) / n,
        "exact_match": sum(p.exact_match for p in pairs) / n,
        "length_delta": sum(p.length_delta for p in pairs) / n,
        "refusal_delta": (sum(p.refusal_canary for p in pairs) - sum(p.refusal_stable for p in pairs)) / n,
    }
