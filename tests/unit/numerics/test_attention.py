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


def test_unpadded_decoding_steps_and_short_prompts_go_to_sdpa_unchanged():
    query, key, value = _qkv(length=LENGTH)
    module = SimpleNamespace(is_causal=True, num_key_value_groups=3)
    step = query[:, :, -1:]  # one new token against the whole cache, no mask: sdpa groups the heads
    assert torch.equal(
        attention.tiled_attention_forward(module, step, key, value, None)[0],
        sdpa_attention_forward(module, step, key, value, None)[0],
    )
    short = [t[:, :, :100] for t in (query, key, value)]
    assert torch.equal(
        attention.tiled_attention_forward(module, *short, None)[0],
        sdpa_attention_forward(module, *short, None)[0],
    )


@pytest.mark.parametrize("mask_kind", ["bool", "additive"])
def test_a_padded_decoding_step_reads_the_cache_in_place_and_computes_what_sdpa_computes(
    mask_kind, monkeypatch
):
    """Left-padded batches (every batched generation) decode with the heads grouped; sdpa's path
    copies K and V once per query head in the group (repeat_kv) first."""
    import transformers.integrations.sdpa_attention as sdpa

    query, key, value = (t.to(torch.bfloat16) for t in _qkv(length=LENGTH))
    step = query[:, :, -1:]
    allowed = torch.ones(3, 1, 1, LENGTH, dtype=torch.bool)
    allowed[1, ..., :50] = False  # row 1 was padded on the left
    mask = allowed if mask_kind == "bool" else torch.where(allowed, 0.0, torch.finfo(torch.bfloat16).min)
    module = SimpleNamespace(is_causal=True, num_key_value_groups=3)
    expected, _ = sdpa_attention_forward(module, step, key, value, mask, scaling=0.2)
    copies = []
    monkeypatch.setattr(sdpa, "repeat_kv", lambda t, n: copies.append(n) or t.repeat_interleave(n, dim=1))
    got, _ = attention.tiled_attention_forward(module, step, key, value, mask, scaling=0.2)
    assert copies == []
    assert got.shape == expected.shape == (3, 1, 6, 32) and got.is_contiguous()
    assert torch.equal(got, expected)  # bit for bit on the CPU, in the model's dtype
    # a mask per head, or a step of more than one token, is left to sdpa
    attention.tiled_attention_forward(module, query[:, :, -2:], key, value, None, scaling=0.2)
    attention.tiled_attention_forward(module, step, key, value, mask.expand(3, 6, 1, LENGTH), scaling=0.2)
    assert copies == [3, 3]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_the_gpu_a_padded_decoding_step_differs_from_sdpa_only_by_rounding():
    query, key, value = (t.to("cuda", torch.bfloat16) for t in _qkv(heads=32, kv_heads=8, batch=4))
    step = query[:, :, -1:]
    allowed = torch.ones(4, 1, 1, LENGTH, dtype=torch.bool, device="cuda")
    allowed[1, ..., :50] = False
    module = SimpleNamespace(is_causal=True, num_key_value_groups=4)
    exact, _ = sdpa_attention_forward(module, *(t.double() for t in (step, key, value)), allowed)
    got, _ = attention.tiled_attention_forward(module, step, key, value, allowed)
    fused, _ = sdpa_attention_forward(module, step, key, value, allowed)
    ours, theirs = (got.double() - exact).abs().max(), (fused.double() - exact).abs().max()
    assert ours <= 2 * theirs + 1e-3


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
        # a left-padded batch decodes with the heads grouped: the same greedy tokens again
        left = torch.ones_like(ids[:, :600])
        left[1, :40] = 0
        padded = {"input_ids": ids[:, :600], "attention_mask": left, "max_new_tokens": 8, "do_sample": False}
        assert torch.equal(loaded.generate(**padded), plain.generate(**padded))
