"""Greedy generation on a GPU with a static KV cache and a compiled decode step.

Why: eager decoding spends most of each step outside the GPU's work. An 8B model at batch 32
reads its 16 GB of weights once per token, about 4 ms on an H200, while transformers' eager
``generate`` over a growing cache launches each layer's kernels from Python and re-allocates
the cache as it grows. With a static cache every decode step has the same shapes, so
transformers compiles the step once (``torch.compile``, CUDA graphs) and replays it.

Shapes repeat only if the inputs' shapes do. Each batch is therefore left-padded to a multiple of
``PAD_TO`` tokens, and the cache is sized to that width plus the new tokens, rounded up. A suite
then compiles a few graphs (one per width bucket and batch size), not one per batch. The extra
padding is masked and position ids follow the mask, so it changes no token a row attends to. It
is removed again before the caller sees the output.

Compiled kernels round differently from eager ones. Every model of an evaluation on the GPU
decodes this way, and the choice is in the GPU reference's key (``runner.GPU_ARITHMETIC``,
``QUANTGATE_COMPILE``), so a source decoded one way is never paired with an artifact decoded
the other way. ``QUANTGATE_COMPILE=0`` keeps the static cache and decodes eagerly. On a CPU,
generation stays eager with transformers' dynamic cache, as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from quantgate.evaluate import fusion

PAD_TO = 256  # prompt widths are rounded up to this (tokens): few distinct shapes, little waste
NEW_TO = 64  # and the new tokens, for the cache's length


def wanted(model) -> bool:
    """Whether ``model`` generates with a static cache here: on a GPU, always."""
    return next(model.parameters()).device.type == "cuda"


def compiled() -> bool:
    """Whether the static decode step is compiled (``QUANTGATE_COMPILE`` is not 0)."""
    return fusion.setting() != "0"


def generate(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    generation_config,
    pad_token_id: int,
    stopping: Callable[[int, int], Any] | None = None,
) -> torch.Tensor:
    """``model.generate`` of left-padded ``input_ids`` with a static cache; returns what generate
    returns for these inputs (prompt columns, then the new tokens), without the extra padding.

    ``stopping(width, rows)`` makes the stopping criteria for the padded prompt's width (lm-eval's
    stop sequences look at the tokens after it)."""
    from transformers import StaticCache

    rows, width = input_ids.shape
    padded = math.ceil(width / PAD_TO) * PAD_TO
    extra = padded - width
    device = next(model.parameters()).device
    ids = torch.full((rows, padded), pad_token_id, dtype=input_ids.dtype, device=device)
    mask = torch.zeros((rows, padded), dtype=attention_mask.dtype, device=device)
    ids[:, extra:] = input_ids.to(device)
    mask[:, extra:] = attention_mask.to(device)
    cache = StaticCache(
        config=model.config, max_cache_len=padded + math.ceil(max_new_tokens / NEW_TO) * NEW_TO
    )
    config = generation_config
    config.disable_compile = not compiled()
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        past_key_values=cache,
        generation_config=config,
        max_new_tokens=max_new_tokens,
        pad_token_id=pad_token_id,
        **({"stopping_criteria": stopping(padded, rows)} if stopping else {}),
    )
    return out[:, extra:]
