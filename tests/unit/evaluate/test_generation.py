"""Evaluation decodes greedily whatever the checkpoint's generation_config.json says.

A checkpoint saying ``num_beams: 48`` turned evaluation into beam search (4.7x slower, and the
source's traces changed), since transformers' ``generate`` starts from the model's generation
config. Here a tiny Llama whose generation_config.json asks for beams, sampling and a repetition
penalty is loaded for evaluation, and what it generates, through ``greedy`` and through a bare
``model.generate`` as lm-eval calls it, is compared with a hand-written argmax loop.
"""

from __future__ import annotations

import json

import pytest
import torch

from quantgate.evaluate.generation import greedy
from quantgate.numerics import load_source_for_eval

pytestmark = pytest.mark.unit

NEW_TOKENS = 12
HOSTILE = {"num_beams": 48, "do_sample": True, "temperature": 0.7, "repetition_penalty": 5.0}


@torch.inference_mode()
def argmax_loop(model, prompt: list[int], eos: int) -> list[int]:
    """Greedy decoding by hand: the most likely next token, one step at a time, up to EOS."""
    ids = list(prompt)
    out: list[int] = []
    for _ in range(NEW_TOKENS):
        token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
        out.append(token)
        ids.append(token)
        if token == eos:
            break
    return out


@pytest.fixture
def hostile_generation_config(tiny_llama):
    path = tiny_llama / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **HOSTILE}))
    return tiny_llama


def test_evaluation_decodes_greedily_whatever_generation_config_says(hostile_generation_config):
    loaded = load_source_for_eval(hostile_generation_config)
    model, tokenizer = loaded.model, loaded.tokenizer
    prompt = tokenizer("Question: what is 12 plus 30? Answer:")["input_ids"]
    expected = argmax_loop(model, prompt, tokenizer.eos_token_id)

    assert greedy(model, tokenizer, [prompt], max_new_tokens=NEW_TOKENS, batch_size=1) == [expected]
    # lm-eval calls generate with its own arguments only: the model's generation config decides the rest
    bare = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)[
        0, len(prompt) :
    ]
    assert bare.tolist()[: len(expected)] == expected
    assert model.generation_config.num_beams == 1
    assert model.generation_config.repetition_penalty in (None, 1.0)


def test_what_was_overridden_is_recorded_with_the_numerics(hostile_generation_config):
    notes = load_source_for_eval(hostile_generation_config).numerics.notes
    note = next(n for n in notes if n.startswith("generation: greedy"))
    for key, value in HOSTILE.items():
        assert f"{key}={value!r}" in note, note


def test_an_ordinary_generation_config_is_recorded_as_such(tiny_llama):
    notes = load_source_for_eval(tiny_llama).numerics.notes
    assert any(n.endswith("the checkpoint's generation config asked for nothing else") for n in notes), notes
