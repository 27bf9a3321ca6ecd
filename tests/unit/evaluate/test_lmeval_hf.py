"""quantgate's lm-eval backend returns what lm-eval's own HF backend returns, checking stops less often.

A tiny random Llama generates; stop strings are picked from the middle of its own unstopped
continuations, so rows of one batch stop at different steps (and one never does). Both backends
run lm-eval's ``generate_until`` on the same requests.
"""

from __future__ import annotations

import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM

from quantgate.evaluate import decode
from quantgate.evaluate.lmeval_hf import CHECK_EVERY, QuantgateHFLM
from quantgate.numerics import load_source_for_eval
from support.models import write_tiny_model

pytestmark = pytest.mark.unit

NEW_TOKENS = 40
PROMPTS = [
    "Question: what is 12 plus 30? Answer:",
    "def add(a, b):\n",
    "The quick brown fox",
    "Quantization maps high precision weights to",
    '{"tool": "get_weather", "arguments":',
]


def _word(text: str, start: int) -> str | None:
    """The first three printable ASCII characters in a row at or after ``start`` (a stop)."""
    for at in range(start, len(text) - 2):
        if all(c.isascii() and c.isprintable() for c in text[at : at + 3]):
            return text[at : at + 3]
    return None


def _requests(until: list[str]) -> list[Instance]:
    kwargs = {"until": until, "max_gen_toks": NEW_TOKENS, "do_sample": False, "temperature": 0.0}
    return [
        Instance(request_type="generate_until", doc={}, arguments=(p, dict(kwargs)), idx=i)
        for i, p in enumerate(PROMPTS)
    ]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return load_source_for_eval(write_tiny_model(tmp_path_factory.mktemp("lmeval_hf") / "tiny", "llama"))


def test_the_same_continuations_as_lm_evals_backend_with_the_host_check_every_few_steps(loaded):
    def lm(cls):
        return cls(
            pretrained=loaded.model, tokenizer=loaded.tokenizer, batch_size=len(PROMPTS), max_length=256
        )

    free = HFLM.generate_until(lm(HFLM), _requests(["<never>"]), disable_tqdm=True)
    # a stop a few characters into three rows' own text, at different depths; the others run on
    found = (_word(text, start) for text, start in zip(free[:3], (6, 20, 45), strict=True))
    stops = [w for w in found if w]
    assert len(stops) >= 2, free
    theirs = lm(HFLM).generate_until(_requests(stops), disable_tqdm=True)
    ours_lm = lm(QuantgateHFLM)
    calls = []
    decode = ours_lm.tokenizer.batch_decode
    ours_lm.tokenizer.batch_decode = lambda *a, **k: calls.append(1) or decode(*a, **k)
    try:
        ours = ours_lm.generate_until(_requests(stops), disable_tqdm=True)
    finally:
        del ours_lm.tokenizer.batch_decode
    assert ours == theirs
    assert sum(len(t) < len(f) for t, f in zip(theirs, free, strict=True)) >= 2  # stops were hit
    assert len(calls) <= NEW_TOKENS // CHECK_EVERY  # lm-eval's decodes every row each step, per stop


def test_a_batch_whose_rows_all_stopped_ends_within_one_check_of_lm_evals(loaded, monkeypatch):
    widths: dict[str, list[int]] = {"theirs": [], "ours": []}

    def recorded(generate, into: str):
        def call(*args, **kwargs):
            out = generate(*args, **kwargs)
            prompt = kwargs["input_ids"] if "input_ids" in kwargs else args[1]
            widths[into].append(out.shape[1] - prompt.shape[1])  # new tokens
            return out

        return call

    monkeypatch.setattr(loaded.model, "generate", recorded(loaded.model.generate, "theirs"))
    monkeypatch.setattr(decode, "generate", recorded(decode.generate, "ours"))
    free = HFLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, batch_size=len(PROMPTS)).generate_until(
        _requests(["<never>"]), disable_tqdm=True
    )
    stops = sorted({w for text in free if (w := _word(text, 2))})  # every row meets one early
    widths["theirs"].clear()
    outs = [
        cls(pretrained=loaded.model, tokenizer=loaded.tokenizer, batch_size=len(PROMPTS)).generate_until(
            _requests(stops), disable_tqdm=True
        )
        for cls in (HFLM, QuantgateHFLM)
    ]
    assert outs[0] == outs[1]
    (theirs,), (ours,) = widths["theirs"], widths["ours"]  # ours decoded without transformers' generate
    assert ours <= theirs + CHECK_EVERY - 1
    assert ours < NEW_TOKENS  # the batch ended before max_gen_toks


def test_rows_are_declared_done_one_by_one_and_only_on_check_steps():
    from quantgate.evaluate.lmeval_hf import StopsEvery

    class Tokens:
        def batch_decode(self, rows):
            return ["".join(chr(97 + t) for t in row) for row in rows]

    check = StopsEvery(Tokens(), ["cd", ""], prompt_len=2, every=4)  # "" stops nothing
    ids = torch.tensor([[0, 0, 2, 3, 0, 0], [0, 0, 0, 0, 0, 0]])  # row 0 says "cd" at once
    assert check(ids[:, :4], None).tolist() == [False, False]  # 2 new tokens: no check yet
    assert check(ids, None).tolist() == [True, False]
    assert check(torch.cat([ids, ids[:, :1]], dim=1), None).tolist() == [True, False]


def test_a_stop_is_not_taken_from_a_last_character_still_incomplete():
    from quantgate.evaluate.lmeval_hf import StopsEvery

    class Bytes:  # each token one byte of UTF-8, as a byte-level BPE decodes an unfinished character
        def batch_decode(self, rows):
            return [bytes(row).decode("utf-8", errors="replace") for row in rows]

    check = StopsEvery(Bytes(), ["a\ufffd"], prompt_len=0, every=2)
    assert check(torch.tensor([[ord("a"), 0xC3]]), None).tolist() == [False]  # "a" and half of "é"
    assert check(torch.tensor([[ord("a"), 0xC3, 0xA9, ord("b")]]), None).tolist() == [False]  # "aéb"
