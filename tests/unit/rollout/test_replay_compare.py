"""The paired measures of replay, on hand-made completions with known answers."""

from __future__ import annotations

import math

import pytest

from quantgate.rollout.replay_compare import Completion, coarse_kl, compare, compared_positions, prompt_sha256

pytestmark = pytest.mark.unit


def _c(text: str, tokens: list[str], tops: list[dict[str, float]]) -> Completion:
    return Completion(text=text, tokens=tuple(tokens), top_logprobs=tuple(tops))


def test_identical_completions_agree_fully():
    tops = [{"a": math.log(0.7), "b": math.log(0.2)}, {"c": math.log(0.9)}]
    pair = compare("hi", _c("ac", ["a", "c"], tops), _c("ac", ["a", "c"], tops))
    assert (pair.top1_agreement, pair.kl, pair.exact_match, pair.length_delta) == (1.0, 0.0, True, 0)
    assert pair.prompt_sha256 == prompt_sha256("hi") and "hi" not in repr(pair)


def test_positions_after_the_parting_token_are_not_compared():
    assert compared_positions(["a", "b", "c"], ["a", "x", "c"]) == 2
    assert compared_positions(["a", "b"], ["a", "b", "c"]) == 2
    s = [{"a": -0.1}, {"b": -0.1}, {"c": -0.1}]
    c = [{"a": -0.1}, {"x": -0.1}, {"c": -0.1}]
    pair = compare("p", _c("abc", ["a", "b", "c"], s), _c("axc", ["a", "x", "c"], c))
    assert pair.top1_agreement == 0.5 and not pair.exact_match


def test_coarse_kl_matches_the_closed_form_and_is_zero_only_when_equal():
    p = {"a": math.log(0.6), "b": math.log(0.3)}
    q = {"a": math.log(0.3), "b": math.log(0.6)}
    expected = 0.6 * math.log(2) + 0.3 * math.log(0.5)  # the rest bins are equal (0.1 each)
    assert coarse_kl(p, q) == pytest.approx(expected)
    assert coarse_kl(p, p) == 0.0
    # a token only one side lists falls into that side's rest bin: a lower bound, never negative
    assert coarse_kl({"a": math.log(0.9)}, {"z": math.log(0.9)}) >= 0.0


def test_refusal_and_length_deltas():
    s = _c("Sure: 4", ["Sure", ":", " 4"], [{"Sure": -0.1}] * 3)
    c = _c("I'm sorry, I can't", ["I'm", " sorry"], [{"I'm": -0.1}] * 2)
    pair = compare("p", s, c)
    assert pair.length_delta == -1 and pair.refusal_canary and not pair.refusal_stable
