"""Greedy decoding on a static cache gives what transformers' ``generate`` gives, token for token.

A tiny random Llama, loaded for evaluation as every suite loads it, decodes a left-padded batch
of prompts of different lengths both ways; an EOS token picked from one row's own continuation
ends that row early. On a GPU the recorded steps (CUDA graphs) give the eager steps' tokens.
"""

from __future__ import annotations

import pytest
import torch

from quantgate.evaluate import decode
from quantgate.numerics import load_source_for_eval
from quantgate.runtime.greedy import greedy_config, token_ids
from support.models import write_tiny_model

pytestmark = pytest.mark.unit

NEW_TOKENS = 37  # not a multiple of the check interval: the last step is a check of its own
PAD = 0


def _batch(lengths: list[int], seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded random prompts of ``lengths`` and their attention mask."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        ids[row, width - length :] = torch.randint(3, 500, (length,), generator=generator)
        mask[row, width - length :] = 1
    return ids, mask


def _new_token_at(free: torch.Tensor, row: int, start: int, taken: list[int]) -> int:
    """The first index from ``start`` whose token in ``row`` is in no row before it nor ``taken``."""
    for at in range(start, free.shape[1]):
        token = int(free[row, at])
        if token not in taken and token not in free[:, :at].flatten().tolist():
            return at
    raise AssertionError(f"row {row} repeats itself from {start} on: {free[row].tolist()}")


def _transformers(model, ids, mask, eos: list[int]) -> torch.Tensor:
    config = greedy_config(model)
    config.eos_token_id = eos  # transformers' generate takes the model's own for an unset (None) one
    return model.generate(
        input_ids=ids,
        attention_mask=mask,
        generation_config=config,
        max_new_tokens=NEW_TOKENS,
        pad_token_id=PAD,
    )


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_source_for_eval(write_tiny_model(tmp_path_factory.mktemp("decode") / "tiny", "llama")).model


def test_a_left_padded_batch_decodes_to_transformers_generate_tokens(model):
    ids, mask = _batch([5, 19, 11, 30])
    assert decode.supports(model)
    eos = token_ids(model.generation_config.eos_token_id)
    ours = decode.generate(model, ids, mask, max_new_tokens=NEW_TOKENS, pad_token_id=PAD, eos_token_ids=eos)
    assert torch.equal(ours, _transformers(model, ids, mask, eos))


def test_an_eos_ends_its_row_with_padding_and_the_batch_where_the_last_row_ended(model):
    ids, mask = _batch([7, 23])
    free = decode.generate(model, ids, mask, max_new_tokens=NEW_TOKENS, pad_token_id=PAD)[:, ids.shape[1] :]
    # each row's own token at a different depth, new to both rows up to there
    first_at = _new_token_at(free, 0, 4, [])
    first = int(free[0, first_at])
    second = int(free[1, _new_token_at(free, 1, 10, [first])])
    eos = [first, second]
    ours = decode.generate(model, ids, mask, max_new_tokens=NEW_TOKENS, pad_token_id=PAD, eos_token_ids=eos)
    assert torch.equal(ours, _transformers(model, ids, mask, eos))
    new = ours[:, ids.shape[1] :]
    assert new.shape[1] < NEW_TOKENS  # cut where the last row finished
    assert (new[0, first_at + 1 :] == PAD).all() and int(new[0, first_at]) == first


def test_a_stop_is_asked_on_check_steps_only_and_its_rows_end_there(model):
    ids, mask = _batch([9, 14, 6])
    asked: list[int] = []

    def stop(sequences: torch.Tensor) -> torch.Tensor:
        asked.append(sequences.shape[1] - ids.shape[1])
        return torch.tensor([len(asked) >= 1, len(asked) >= 2, False])  # row 0 at 8, row 1 at 16

    out = decode.generate(model, ids, mask, max_new_tokens=NEW_TOKENS, pad_token_id=PAD, stop=stop)
    new = out[:, ids.shape[1] :]
    assert asked == [8, 16, 24, 32, NEW_TOKENS]
    assert (new[0, 8:] == PAD).all() and (new[1, 16:] == PAD).all()
    free = decode.generate(model, ids, mask, max_new_tokens=NEW_TOKENS, pad_token_id=PAD)[:, ids.shape[1] :]
    assert torch.equal(new[2], free[2]) and torch.equal(new[0, :8], free[0, :8])


def test_models_with_a_sliding_window_are_left_to_transformers_generate(tmp_path):
    from transformers import AutoModelForCausalLM

    from support.models import tiny_config

    windowed = AutoModelForCausalLM.from_config(tiny_config("llama"))
    windowed.config.sliding_window = 16
    assert not decode.supports(windowed)
    windowed.config.sliding_window = None
    windowed.config._attn_implementation = "eager"  # its mask is additive, not sdpa's boolean one
    assert not decode.supports(windowed)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_the_gpu_recorded_steps_give_the_eager_steps_tokens(model):
    gpu = model.to("cuda")
    ids, mask = _batch([5, 19, 11, 30])
    graphed = [decode.generate(gpu, ids, mask, max_new_tokens=NEW_TOKENS, pad_token_id=PAD) for _ in range(2)]
    step = getattr(gpu, decode._ATTR)
    assert step.graph is not None  # recorded on the first batch, replayed by the second
    step.graph, step.graphs = None, False
    eager = decode.generate(gpu, ids, mask, max_new_tokens=NEW_TOKENS, pad_token_id=PAD)
    assert torch.equal(graphed[0], eager) and torch.equal(graphed[1], eager)


def test_a_free_run_stops_where_it_leaves_the_trace_and_keeps_the_first_divergence(model):
    # long-chain's free run only measures where an artifact leaves the source's trace: its rows
    # stop soon after, with the same first divergence as a run to the token limit
    from types import SimpleNamespace

    from quantgate.evaluate.generation import greedy
    from quantgate.evaluate.suites.long_chain import first_divergence

    tokenizer = SimpleNamespace(pad_token_id=PAD, eos_token_id=None)
    ids, _ = _batch([6, 14, 9], seed=5)
    prompts = [[t for t in row if t != PAD] for row in ids.tolist()]
    full = greedy(model, tokenizer, prompts, max_new_tokens=NEW_TOKENS, batch_size=3)
    changed = [*full[1][:5], full[1][5] + 1, *full[1][6:]]  # leaves it at 5
    traces = [full[0], changed, full[2][:12]]  # the same; changed at 5; ends at 12
    stopped = greedy(model, tokenizer, prompts, max_new_tokens=NEW_TOKENS, batch_size=3, until_leaving=traces)
    assert [first_divergence(t, s) for t, s in zip(traces, stopped, strict=True)] == [NEW_TOKENS, 5, 12]
    assert [first_divergence(t, f) for t, f in zip(traces, full, strict=True)] == [NEW_TOKENS, 5, 12]
    assert stopped[0] == full[0]  # never left: to the limit
    assert len(stopped[1]) == decode.CHECK_EVERY and len(stopped[2]) == 2 * decode.CHECK_EVERY
    assert all(s == f[: len(s)] for s, f in zip(stopped, full, strict=True))


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_a_moe_source_decodes_to_transformers_generate_tokens(kind, tmp_path):
    # the fleet's first model class is large MoE: its routed experts run in each decoding step
    moe = load_source_for_eval(write_tiny_model(tmp_path / kind, kind)).model
    ids, mask = _batch([5, 20, 11])
    assert decode.supports(moe)
    ours = decode.generate(moe, ids, mask, max_new_tokens=NEW_TOKENS, pad_token_id=PAD)
    assert torch.equal(ours, _transformers(moe, ids, mask, []))
