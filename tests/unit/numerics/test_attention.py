"""Tiled causal attention computes what sdpa computes, and is what evaluation loads."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from quantgate.numerics import attention, load_source_for_eval
from support.models import write_tiny_model

LENGTH = 700  # over two query blocks, the last one partial


def _qkv(dtype=torch.float32, heads=6, kv_heads=2, length=LENGTH, batch=3):
    g = torch.Generator().manual_seed(0)
    shape = lambda h: (batch, h, length, 32)
    return [torch.randn(shape(h), generator=g, dtype=dtype) for h in (heads, kv_heads, kv_heads)]


def _left_padded_mask(causal: bool, pad: int = 50) -> torch.Tensor:
    allowed = torch.ones(3, 1, LENGTH, LENGTH, dtype=torch.bool)
    if causal:
        allowed &= torch.ones(LENGTH, LENGTH, dtype=torch.bool).tril()
    allowed[1, :, :, :pad] = False
    return allowed


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("mask_kind", [None, "bool", "additive"])
def test_tiled_equals_sdpa_in_float32(causal, mask_kind):
    query, key, value = _qkv()
    module = SimpleNamespace(is_causal=causal, num_key_value_groups=3)
    mask = None
    if mask_kind is not None:
        allowed = _left_padded_mask(causal)
        mask = allowed if mask_kind == "bool" else torch.where(allowed, 0.0, torch.finfo(torch.float32).min)
    expected, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.2)
    got, _ = attention.tiled_attention_forward(module, query, key, value, mask, scaling=0.2)
    assert got.shape == expected.shape == (3, LENGTH, 6, 32)
    # row 1's first 50 queries see only padding: what they hold is never read
    torch.testing.assert_close(got[:, 50:], expected[:, 50:], rtol=1e-5, atol=1e-5)


def test_bf16_differs_from_sdpa_only_by_rounding():
    query, key, value = _qkv(torch.bfloat16)
    module = SimpleNamespace(is_causal=True, num_key_value_groups=3)
    exact, _ = sdpa_attention_forward(module, *(t.double() for t in (query, key, value)), None)
    got, _ = attention.tiled_attention_forward(module, query, key, value, None)
    fused, _ = sdpa_attention_forward(module, query, key, value, None)
    ours, theirs = (got.double() - exact).abs().max(), (fused.double() - exact).abs().max()
    assert ours < 0.05 and ours <= 4 * theirs


def test_decoding_steps_and_short_prompts_go_to_sdpa_unchanged():
    query, key, value = _qkv(length=LENGTH)
    module = SimpleNamespace(is_causal=True, num_key_value_groups=3)
    step = query[:, :, -1:]  # one new token against the whole cache
    assert torch.equal(
        attention.tiled_attention_forward(module, step, key, value, None)[0],
        sdpa_attention_forward(module, step, key, value, None)[0],
    )
    short = [t[:, :, :100] for t in (query, key, value)]
    assert torch.equal(
        attention.tiled_attention_forward(module, *short, None)[0],
        sdpa_attention_forward(module, *short, None)[0],
    )


@pytest.fixture(scope="module")
def long_context_llama(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("attn") / "tiny", "llama", max_position_embeddings=1024)


def test_evaluation_loads_tiled_attention_and_matches_sdpa_logits(long_context_llama):
    loaded = load_source_for_eval(long_context_llama).model.float()
    assert loaded.config._attn_implementation == attention.NAME
    plain = AutoModelForCausalLM.from_pretrained(long_context_llama, dtype=torch.float32).eval()
    assert plain.config._attn_implementation == "sdpa"
    ids = torch.randint(3, 500, (2, LENGTH), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 600:] = 0  # right padding, as a short last window is padded
    with torch.inference_mode():
        for m in (None, mask):
            torch.testing.assert_close(
                loaded(input_ids=ids, attention_mask=m).logits[:, :600],
                plain(input_ids=ids, attention_mask=m).logits[:, :600],
                rtol=1e-4,
                atol=1e-4,
            )
        # generation: a tiled prefill, then sdpa decoding steps; the same greedy tokens
        prompt = ids[:1, :600]
        assert torch.equal(
            loaded.generate(prompt, max_new_tokens=5, do_sample=False),
            plain.generate(prompt, max_new_tokens=5, do_sample=False),
        )
