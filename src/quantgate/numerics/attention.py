"""Causal attention for CPU prefill, tiled by query block so that no work is spent above the diagonal.

Why our own: teacher-forced scoring (perplexity, KLD) is one long prefill per window, and on CPU
torch's fused ``scaled_dot_product_attention`` kernel spends as long on a 512-token window as all
of a small model's projections do (profiled on the default model: 0.86 s of attention against
1.1 s of matmuls for 4,096 tokens). Splitting the queries into blocks lets every block attend
only to the keys at or before its last position, so the blocks above the diagonal are never
computed, and each block's scores (heads x block x keys, float32) stay in cache. Measured in
``bench/eval_throughput.py`` (BENCHMARKS.md).

What it computes is sdpa's contract, term for term: the same mask semantics (boolean "may
attend" or additive float), grouped-query heads, scaling, float32 softmax. Its rounding is a
GPU flash kernel's: both products take their bf16 operands widened (exactly) to float32 and
accumulate in float32, the scores stay float32, and the probabilities are rounded to the
model's dtype before the product with V (``cpu_gemm``: on a CPU without native bf16, ATen's
bf16 batched GEMM was 71 % of a source pass, and it rounded the scores to bf16 first).
Everything this path does not cover (decoding steps, where queries and keys differ in length;
dropout; position biases; devices other than CPU; short prompts, where tiling has nothing to
save) goes to transformers' sdpa function unchanged, so generation behaves exactly as it did.

Registered with transformers as ``quantgate_tiled`` (with sdpa's mask function), so models load
with ``attn_implementation="quantgate_tiled"`` and the FP8 KV-cache emulation can wrap it like
any other implementation.
"""

from __future__ import annotations

import torch

NAME = "quantgate_tiled"
_BLOCK = 256  # query positions per tile; 128-512 measured, 256 fastest on the default model
_MIN_TOKENS = 2 * _BLOCK  # shorter prefills have no upper triangle worth skipping


def tiled_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    position_bias: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: ``query`` [B, H, L, D], ``key``/``value`` [B, KV, L, D];
    returns ([B, L, H, D], None) like sdpa's."""
    q_len, kv_len = query.shape[2], key.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if (
        query.device.type != "cpu"
        or q_len != kv_len
        or q_len < _MIN_TOKENS
        or dropout > 0.0
        or position_bias is not None
        or query.shape[1] % key.shape[1] != 0
        or (torch.is_grad_enabled() and query.requires_grad)
    ):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            position_bias=position_bias,
            **kwargs,
        )
    return _tiled(query, key, value, attention_mask, scaling, causal), None


def _tiled(query, key, value, attention_mask, scaling, causal: bool) -> torch.Tensor:
    batch, heads, length, dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    scale = scaling if scaling is not None else dim**-0.5
    v_dim = value.shape[-1]  # MLA (DeepSeek): values are narrower than queries and keys
    out = query.new_empty((batch, length, heads, v_dim))
    positions = torch.arange(length)
    lowest = torch.finfo(torch.float32).min
    for b in range(batch):
        # heads sharing a KV head are contiguous (transformers' repeat_kv), so a group's queries
        # stack into one [group * block, D] matrix against its single K and V
        q_b = query[b].float().reshape(kv_heads, group, length, dim)
        key_b, value_b = key[b].float(), value[b].float()
        for start in range(0, length, _BLOCK):
            stop = min(length, start + _BLOCK)
            keys = stop if causal else length
            q = q_b[:, :, start:stop].reshape(kv_heads, group * (stop - start), dim)
            scores = torch.matmul(q, key_b[:, :keys].transpose(-1, -2)).mul_(scale)
            scores = scores.view(kv_heads, group, stop - start, keys)
            if causal:  # only the diagonal block has keys after some of its queries
                above = positions[start:stop, None] < positions[None, start:stop]
                scores[..., start:stop].masked_fill_(above, lowest)
            if attention_mask is not None:
                mask = attention_mask[b if attention_mask.shape[0] > 1 else 0, :, start:stop, :keys]
                if mask.dtype == torch.bool:
                    scores.masked_fill_(~mask, lowest)
                else:
                    scores.add_(mask.float()).clamp_(min=lowest)
            # probabilities in the model's dtype, as the kernel multiplies them; the context is
            # stored in it when it is written to ``out``
            probs = torch.softmax(scores, dim=-1).to(value.dtype).float()
            probs = probs.view(kv_heads, group * (stop - start), keys)
            ctx = torch.matmul(probs, value_b[:, :keys]).view(kv_heads * group, stop - start, v_dim)
            out[b, start:stop] = ctx.transpose(0, 1)
    return out


def register() -> str:
    """Make ``quantgate_tiled`` known to transformers (idempotent); returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(NAME, tiled_attention_forward)
    AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    return NAME
