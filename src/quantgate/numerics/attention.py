"""Causal attention for CPU prefill, tiled by query block so that no work is spent above the diagonal.

Why our own: teacher-forced scoring (perplexity, KLD) is one long prefill per window, and on CPU
torch's fused ``scaled_dot_product_attention`` kernel spends as long on a 512-token window as all
of a small model's projections do (profiled on the default model: 0.86 s of attention against
1.1 s of matmuls for 4,096 tokens). Splitting the queries into blocks lets every block attend
only to the keys at or before its last position, so the blocks above the diagonal are never
computed, and each block's scores (heads x block x keys, float32) stay in cache. Measured in
``bench/eval/eval_throughput.py`` (BENCHMARKS.md).

What it computes is sdpa's contract, term for term: the same mask semantics (boolean "may
attend" or additive float), grouped-query heads, scaling, float32 softmax. Its rounding is a
GPU flash kernel's: both products take their bf16 operands widened (exactly) to float32 and
accumulate in float32, the scores stay float32, and the probabilities are rounded to the
model's dtype before the product with V (``cpu_gemm``: on a CPU without native bf16, ATen's
bf16 batched GEMM was 71 % of a source pass, and it rounded the scores to bf16 first).
Everything this path does not cover (decoding steps, where queries and keys differ in length;
dropout; position biases; devices other than CPU; short prompts, where tiling has nothing to
save) goes to transformers' sdpa function, with one change for decoding.

A decoding step of a batch with padding (every batched generation: prompts are left-padded)
runs its grouped-query heads as one query block per KV head (``grouped_decode``). transformers'
sdpa path passes K and V to torch's kernel with the heads grouped only when there is no mask;
with one, it first copies the whole cache ``heads / kv_heads`` times (``repeat_kv``), every
layer, every step. Profiled at 8B on an H200 (batch 32, five-shot GSM8K prompts, lm-eval's own
generation): that copy was 38 % of the GPU's time, and a step took 29.8 ms padded against
21.4 ms unpadded (``bench/gpu/gpu_lmeval_generation.py``, BENCHMARKS.md). A single query attends to
every key its mask allows, so stacking a group's queries as rows changes no term of the sum.

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
    if query.shape[2] == 1 and query.device.type == "cpu":
        key, value, attention_mask = _cut_unattended(key, value, attention_mask)
    q_len, kv_len = query.shape[2], key.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if _groups_decode(query, key, attention_mask, dropout, position_bias):
        return grouped_decode(query, key, value, attention_mask, scaling), None
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


def _cut_unattended(key, value, attention_mask):
    """A decoding step's keys after the last position any row may attend to are left out.

    Why: a static cache (``evaluate.decode``) holds positions not yet written, masked; they add
    exact zeros, but torch's CPU kernel blocks its sums by the keys' length, so its rounding would
    differ from a dynamic cache's over the same tokens. Cut, both give the same bits. On the CPU
    only: finding the end waits for the mask, which a GPU's recorded (graph) step cannot do."""
    if attention_mask is None or attention_mask.dim() != 4 or attention_mask.dtype != torch.bool:
        return key, value, attention_mask
    attended = attention_mask.reshape(-1, attention_mask.shape[-1]).any(0).nonzero()
    end = int(attended.max()) + 1 if len(attended) else attention_mask.shape[-1]
    if end == key.shape[2]:
        return key, value, attention_mask
    return key[:, :, :end], value[:, :, :end], attention_mask[..., :end]


def _groups_decode(query, key, attention_mask, dropout: float, position_bias) -> bool:
    """Whether a step is one ``grouped_decode`` computes: one new token per row, heads grouped,
    a mask the same for every head (without a mask sdpa groups the heads itself)."""
    heads, kv_heads = query.shape[1], key.shape[1]
    return (
        query.shape[2] == 1
        and attention_mask is not None
        and attention_mask.dim() == 4
        and attention_mask.shape[1] == 1
        and attention_mask.shape[2] == 1
        and heads != kv_heads
        and heads % kv_heads == 0
        and key.shape[-1] == query.shape[-1]
        and dropout == 0.0
        and position_bias is None
        and not (torch.is_grad_enabled() and query.requires_grad)
    )


def grouped_decode(query, key, value, attention_mask, scaling) -> torch.Tensor:
    """One decoding step's attention, [B, 1, H, Dv], with K and V read in place.

    ``query`` [B, H, 1, D] becomes [B, KV, H/KV, D]: the heads that share a KV head (contiguous,
    as in transformers' ``repeat_kv``) are that head's block of queries, none causal to another,
    each masked by the row's [1, kv] mask (broadcast over the block)."""
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, dim)
    out = torch.nn.functional.scaled_dot_product_attention(
        grouped, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False, scale=scaling
    )
    return out.reshape(batch, heads, 1, value.shape[-1]).transpose(1, 2).contiguous()


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
