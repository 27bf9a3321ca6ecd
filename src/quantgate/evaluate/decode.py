"""Greedy decoding on a static KV cache; on a GPU each decoding step is one CUDA graph replay.

Why: a decoding step of a batch is one token per row, so it is bound by the host launching
kernels, not by the GPU. At 8B on an H200 (batch 32, five-shot GSM8K prompts) transformers'
eager step launched about 2,000 kernels and took 26-35 ms where the GPU's own work was about
10 ms and reading the weights 3.7 ms (``bench/gpu/gpu_lmeval_generation.py``, BENCHMARKS.md).
``torch.compile`` of the step (transformers' static-cache path) compiled for 37-60 s per shape
and still ran at 14.5 ms. A CUDA graph records the eager step's kernels once (the cost of one
step) and replays them with one launch; the kernels, and so the numbers, are the eager step's.

What it computes is transformers' greedy ``generate`` with a stopping rule, step for step:
- the prompt is prefilled as ``generate`` does it (the same dynamic cache and attention, the
  last position's logits only), then its keys and values are copied into a static cache;
- positions come from the attention mask (``cumsum - 1``), padding is masked, every row takes
  the argmax of its logits, a finished row is fed and given ``pad_token_id``;
- a row finishes at an EOS token (every step, on the GPU) or when ``stop`` says so; ``stop`` is
  asked on the host every ``CHECK_EVERY`` new tokens, the only time the host waits for the GPU;
- the batch ends when every row has finished, and what comes back is cut to the step where the
  last one did, as ``generate`` returns it.

Measured on the H200 at 8B (BENCHMARKS.md): about 11 ms a step against lm-eval's 43-59 ms, for the
source and for a hopper-fp8 artifact (native FP8, FP8 KV cache) alike. A step that cannot be
recorded (one that copies from host memory, as compressed-tensors' NVFP4 scales once did:
``formats.nvfp4_group_scales``) decodes eagerly, with a warning in the log.

An FP8 KV cache is stored as it is written (``StoringCache``): each new token's K and V once,
not the whole cache at every step, with the same values (``numerics.stored_hooks``).

Where its numbers can differ from ``generate``'s: the static cache is longer than the tokens so
far (``_BUCKET``-rounded, so that one graph serves batches of nearby lengths), and a GPU
attention kernel may split a longer row of keys differently. The masked keys add exact zeros;
on the CPU attention leaves them out (``attention._cut_unattended``) and the tokens are
``generate``'s bit for bit (tests; and the trained default model's 8 five-shot GSM8K prompts,
64 tokens). Models this does not cover (sliding window or hybrid caches, attention other than
sdpa's kind, encoder-decoders) use ``generate``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from transformers import StaticCache

log = logging.getLogger(__name__)

CHECK_EVERY = 8  # new tokens between two host checks: the host's stop decode over 8 steps
_BUCKET = 256  # static cache lengths are multiples of this, so one graph serves nearby prompts
_ATTR = "_quantgate_decode_step"  # the model's last decoding step (its cache, buffers and graph)
# attention whose mask is sdpa's boolean "may attend" mask (the one this module builds)
_SDPA_KIND = ("sdpa", "quantgate_tiled")

Stop = Callable[[Tensor], Tensor]  # the sequences so far (prompt + new) -> which rows are done


def supports(model) -> bool:
    """Whether ``generate`` can decode ``model``: a decoder with one full-attention cache per layer
    and sdpa-style attention (bare, tiled, or inside the FP8 KV-cache wrapper)."""
    config = model.config
    text = config.get_text_config(decoder=True)
    attention = (config._attn_implementation or "").rsplit("+", 1)[-1]
    layer_types = getattr(text, "layer_types", None) or ["full_attention"]
    return (
        not config.is_encoder_decoder
        and attention in _SDPA_KIND
        and set(layer_types) == {"full_attention"}
        and getattr(text, "sliding_window", None) in (None, 0)
    )


def inferred_mask(input_ids: Tensor, pad_token_id: int | None, eos_token_ids: Sequence[int]) -> Tensor:
    """The attention mask ``generate`` infers when it is given none (lm-eval passes none): the
    non-pad tokens, unless the pad token is also an EOS token, when every token is attended."""
    if pad_token_id is None or pad_token_id in eos_token_ids:
        return torch.ones_like(input_ids)
    return input_ids.ne(pad_token_id).long()


@torch.inference_mode()
def generate(
    model,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    max_new_tokens: int,
    pad_token_id: int,
    eos_token_ids: Sequence[int] = (),
    stop: Stop | None = None,
) -> Tensor:
    """Prompts and their greedy continuations, [B, prompt + new], as transformers' ``generate``
    returns them (finished rows padded, cut where the last row finished)."""
    device = model.get_input_embeddings().weight.device
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    if max_new_tokens <= 0:
        return input_ids
    batch, width = input_ids.shape
    positions = (attention_mask.long().cumsum(-1) - 1).masked_fill_(attention_mask == 0, 0)
    logits, step = _prefill(model, input_ids, attention_mask, positions, width + max_new_tokens)
    next_position = positions[:, -1] + 1
    tokens = input_ids.new_full((batch, max_new_tokens), pad_token_id)
    unfinished = torch.ones(batch, dtype=torch.bool, device=device)
    finished_at = torch.full((batch,), max_new_tokens, dtype=torch.long, device=device)
    eos = torch.tensor(list(eos_token_ids), dtype=torch.long, device=device)
    for index in range(max_new_tokens):
        token = torch.where(unfinished, logits.argmax(-1), pad_token_id)
        tokens[:, index] = token
        done = torch.isin(token, eos) if len(eos) else torch.zeros_like(unfinished)
        count = index + 1
        checks = count % CHECK_EVERY == 0 or count == max_new_tokens
        if checks and stop is not None:
            done = done | stop(torch.cat([input_ids, tokens[:, :count]], dim=1)).to(device)
        finished_at = torch.where(unfinished & done, count, finished_at)
        unfinished = unfinished & ~done
        if count == max_new_tokens or (checks and not bool(unfinished.any())):
            break
        logits = step.run(model, token, next_position + index, width + index)
    return torch.cat([input_ids, tokens[:, : int(finished_at.max())]], dim=1)


def release(model) -> None:
    """Free the model's decoding step (its static cache, several GB at 8B, and its graph): a
    suite calls this when its generation is done, before the model scores or is dropped."""
    if getattr(model, _ATTR, None) is not None:
        setattr(model, _ATTR, None)


def _prefill(
    model, input_ids: Tensor, attention_mask: Tensor, positions: Tensor, length: int
) -> tuple[Tensor, _Step]:
    """The prompt's forward as ``generate`` runs it (dynamic cache, so the same attention path);
    its keys and values then move into the model's static cache. Returns the last logits and the
    decoding step that holds that cache."""
    from transformers import DynamicCache

    dynamic = DynamicCache(config=model.config)
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions,
        past_key_values=dynamic,
        use_cache=True,
        logits_to_keep=1,
    )
    step = _step_for(model, input_ids.shape[0], -(-length // _BUCKET) * _BUCKET, input_ids.device)
    step.load(dynamic, attention_mask)
    return out.logits[:, -1], step


def _step_for(model, batch: int, length: int, device: torch.device) -> _Step:
    """The model's decoding step for this batch size and cache length: the last one if it fits
    (its graph is kept), else a new one (the old one's cache and graph are freed first)."""
    step = getattr(model, _ATTR, None)
    if step is not None and step.shape == (batch, length):
        return step
    setattr(model, _ATTR, None)
    step = _Step.new(model, batch, length, device)
    setattr(model, _ATTR, step)
    return step


@dataclass
class _Step:
    """One decoding step's fixed state: the static cache, the input buffers a step reads (token,
    position, the mask over the cache) and, on a GPU, the step recorded as a CUDA graph."""

    shape: tuple[int, int]
    cache: StaticCache
    token: Tensor
    position: Tensor
    mask: Tensor
    graph: torch.cuda.CUDAGraph | None = None
    logits: Tensor | None = None
    graphs: bool = False

    # the forward's keywords: with a ``StoringCache``, the FP8 KV emulation is told K and V are stored
    forward_kwargs: dict = field(default_factory=dict)

    @classmethod
    def new(cls, model, batch: int, length: int, device: torch.device) -> _Step:
        from transformers import StaticCache

        from quantgate.evaluate.storing_cache import StoringCache
        from quantgate.numerics import KV_STORED, stored_hooks

        hooks = stored_hooks(model)
        cache = (
            StoringCache(hooks, config=model.config, max_cache_len=length)
            if hooks
            else StaticCache(config=model.config, max_cache_len=length)
        )
        return cls(
            shape=(batch, length),
            cache=cache,
            forward_kwargs={KV_STORED: True} if hooks else {},
            token=torch.zeros((batch, 1), dtype=torch.long, device=device),
            position=torch.zeros((batch, 1), dtype=torch.long, device=device),
            mask=torch.zeros((batch, length), dtype=torch.bool, device=device),
            graphs=device.type == "cuda" and _all_on(model, device),
        )

    def load(self, dynamic, attention_mask: Tensor) -> None:
        """The prompt's keys and values at the cache's start, its mask over them, nothing after."""
        self.cache.reset()
        for index, layer in enumerate(dynamic.layers):
            self.cache.update(layer.keys, layer.values, index)
        self.mask.zero_()
        self.mask[:, : attention_mask.shape[1]] = attention_mask.bool()

    def run(self, model, token: Tensor, position: Tensor, index: int) -> Tensor:
        """The logits after ``token`` at ``position``, its keys written at cache ``index``."""
        self.token.copy_(token[:, None])
        self.position.copy_(position[:, None])
        self.mask[:, index] = True
        if self.graph is not None and self.logits is not None:
            self.graph.replay()
            return self.logits
        if not self.graphs:
            return self._forward(model)
        # this eager step is the warm-up, on a side stream as CUDA graphs ask; then record the next
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            logits = self._forward(model)
        torch.cuda.current_stream().wait_stream(stream)
        self._capture(model)
        return logits

    def _forward(self, model) -> Tensor:
        return model(
            input_ids=self.token,
            position_ids=self.position,
            attention_mask=self.mask[:, None, None, :],
            past_key_values=self.cache,
            use_cache=True,
            **self.forward_kwargs,
        ).logits[:, -1]

    def _capture(self, model) -> None:
        """Record one step (recording runs nothing: the cache is unchanged). A model whose step
        waits on the host (a data-dependent shape, a copy from host memory) cannot be recorded
        and decodes eagerly, with the same numbers."""
        self.graphs = False
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                logits = self._forward(model)
        except RuntimeError as error:
            log.warning(
                "decoding steps run eagerly: the step could not be recorded as a CUDA graph (%s)", error
            )
            return
        self.graph, self.logits = graph, logits


def _all_on(model, device: torch.device) -> bool:
    """Every parameter and buffer on ``device`` (an offloaded layer copies from host memory)."""
    tensors = [*model.parameters(), *model.buffers()]
    return all(t.device == device for t in tensors)
