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


def test_the_static_cache_path_generates_what_the_dynamic_one_does(tiny_llama, monkeypatch):
    """On a GPU, batches decode through ``static_generate``: prompts padded to a width bucket, a
    static cache. Run here on the CPU (eager, the same padding and cache), it must give every row
    the tokens transformers' own generate gives, whatever the rows' lengths."""
    from quantgate.evaluate import static_generate

    loaded = load_source_for_eval(tiny_llama)
    model, tokenizer = loaded.model, loaded.tokenizer
    texts = ["Question: what is 12 plus 30? Answer:", "Hi", "Write a poem about the sea " * 6]
    prompts = [tokenizer(t)["input_ids"] for t in texts]
    eager = greedy(model, tokenizer, prompts, max_new_tokens=NEW_TOKENS, batch_size=3)

    monkeypatch.setattr(static_generate, "wanted", lambda _model: True)
    monkeypatch.setattr(static_generate, "PAD_TO", 16)  # the longest prompt crosses a bucket
    static = greedy(model, tokenizer, prompts, max_new_tokens=NEW_TOKENS, batch_size=3)
    assert static == eager
    assert all(len(row) > 0 for row in static)


def test_lm_evals_generation_through_the_static_cache_matches_its_own(tiny_llama, monkeypatch):
    """gsm8k and humaneval generate inside lm-eval's HF backend; on a GPU its ``_model_generate``
    goes through ``static_generate`` with lm-eval's stop sequences. Same context, same stops: the
    same continuation, prompt columns included, as lm-eval's own call."""
    from lm_eval.models.huggingface import HFLM

    from quantgate.evaluate import lmeval, static_generate

    loaded = load_source_for_eval(tiny_llama)
    model, tokenizer = loaded.model, loaded.tokenizer
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    tokenizer.padding_side = "left"
    batch = tokenizer(
        ["Question: 2 plus 2?\nAnswer:", "Q: name a colour.\nA:"], return_tensors="pt", padding=True
    )
    stops = ["\n\n", "Question:"]
    args = {
        "context": batch["input_ids"],
        "max_length": batch["input_ids"].shape[1] + NEW_TOKENS,
        "stop": stops,
    }

    own = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=2)._model_generate(
        attention_mask=batch["attention_mask"], do_sample=False, **args
    )
    monkeypatch.setattr(static_generate, "PAD_TO", 16)
    static_lm = lmeval._static_hflm()(pretrained=model, tokenizer=tokenizer, batch_size=2)
    ours = static_lm._model_generate(attention_mask=batch["attention_mask"], do_sample=False, **args)
    width = batch["input_ids"].shape[1]
    assert ours[:, :width].tolist() == batch["input_ids"].tolist()
    # lm-eval cuts each continuation at its first stop sequence: compare what it keeps
    for a, b in zip(own[:, width:].tolist(), ours[:, width:].tolist(), strict=True):
        text_a, text_b = tokenizer.decode(a), tokenizer.decode(b)
        assert min((text_a.split(s)[0] for s in stops), key=len) == min(
            (text_b.split(s)[0] for s in stops), key=len
        )
    with pytest.raises(ValueError, match="decode greedily"):
        static_lm._model_generate(attention_mask=batch["attention_mask"], do_sample=True, **args)
