"""Paired comparison of two greedy completions of one prompt: the measures of a ``ReplayPair``.

Both endpoints answer at temperature 0 with their top-k log-probabilities per generated position.

Positions compared: the generated positions whose context is the same on both sides, i.e. the
common prefix of the two token sequences plus the first position where they part (past it the two
engines condition on different text, and a comparison there says nothing about the engines).
``top1_agreement`` is the share of those positions whose top-1 token agrees: 1.0 for identical
outputs, ``p / (p + 1)`` when they part after ``p`` agreeing tokens.

KL and the tail: an engine returns only its top-k, so the full distributions are unknown. Both are
coarse-grained onto the tokens in *both* top-k lists plus one "rest" bin holding all other mass
(``1 - sum`` of the listed probabilities). By the data-processing inequality this KL is a lower
bound of the true KL(stable || canary) at that position; it is 0 when the two top-k agree exactly.
Probabilities are floored at ``1e-12`` so that a rounding-negative rest bin stays finite.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from quantgate.rollout.evidence import ReplayPair

FLOOR = 1e-12
REFUSAL = re.compile(
    r"\b(I can(?:no|')t|I cannot|I'm sorry|I am sorry|I won't|I will not|As an AI|I'm unable|I am unable)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Completion:
    """One endpoint's greedy answer: text, tokens, and top log-probabilities per position."""

    text: str
    tokens: tuple[str, ...]
    top_logprobs: tuple[dict[str, float], ...]


def prompt_sha256(prompt: str) -> str:
    """The prompt's identity in every output: the prompt itself is never written."""
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()


def _top1(top: dict[str, float]) -> str | None:
    return max(top, key=lambda t: top[t]) if top else None


def coarse_kl(p_top: dict[str, float], q_top: dict[str, float]) -> float:
    """KL(P || Q) over the tokens both lists hold plus a "rest" bin (a lower bound of the true KL)."""
    shared = sorted(set(p_top) & set(q_top))
    p = [math.exp(p_top[t]) for t in shared]
    q = [math.exp(q_top[t]) for t in shared]
    p.append(max(1.0 - sum(p), 0.0))
    q.append(max(1.0 - sum(q), 0.0))
    return sum(pi * math.log(max(pi, FLOOR) / max(qi, FLOOR)) for pi, qi in zip(p, q, strict=True) if pi > 0)


def compared_positions(stable: Sequence[str], canary: Sequence[str]) -> int:
    """How many leading positions share their context: the common prefix, plus the parting one."""
    prefix = 0
    for a, b in zip(stable, canary, strict=False):
        if a != b:
            return prefix + 1
        prefix += 1
    return prefix


def is_refusal(text: str) -> bool:
    """A refusal phrase in the first 200 characters (where models put them)."""
    return bool(REFUSAL.search(text[:200]))


def compare(prompt: str, stable: Completion, canary: Completion) -> ReplayPair:
    """The paired measures of one prompt's two completions."""
    n = min(
        compared_positions(stable.tokens, canary.tokens), len(stable.top_logprobs), len(canary.top_logprobs)
    )
    agree = sum(
        1 for i in range(n) if _top1(stable.top_logprobs[i]) == _top1(canary.top_logprobs[i]) is not None
    )
    kls = [coarse_kl(stable.top_logprobs[i], canary.top_logprobs[i]) for i in range(n)]
    return ReplayPair(
        prompt_sha256=prompt_sha256(prompt),
        top1_agreement=agree / n if n else 1.0,
        kl=sum(kls) / n if n else 0.0,
        exact_match=stable.text == canary.text,
        length_delta=len(canary.tokens) - len(stable.tokens),
        refusal_stable=is_refusal(stable.text),
        refusal_canary=is_refusal(canary.text),
    )
