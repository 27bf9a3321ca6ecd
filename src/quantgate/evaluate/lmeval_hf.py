"""lm-eval's HF backend with its stop sequences checked every few decoding steps, not every step.

Why: lm-eval's ``MultiTokenEOSCriteria`` decodes the last tokens of every row on the host, once
per stop sequence and per step (gsm8k has three), and answers for the whole batch at once. At 8B
on an H200 (batch 32, five-shot GSM8K prompts) that check was 3.3 ms of a 36.6 ms step
(``bench/gpu/gpu_lmeval_generation.py``, BENCHMARKS.md).

What changes is only when a stop is noticed, not what is generated or returned: greedy tokens
do not depend on when a row is declared done, lm-eval cuts each continuation at its first stop
sequence afterwards (``generate_until``), and a row noticed a few steps late carries a few more
tokens past that cut. A row is checked on its whole continuation, whose text only grows as tokens
come, except for a last character still incomplete (a byte-level tokenizer decodes its bytes to
U+FFFD until the rest arrives), which is left out of the check. Rows are declared done one by one,
as transformers does at EOS (their later tokens are padding); the batch ends when all are done.

Where the two can differ: lm-eval decodes only the last few tokens of a row, on their own, and
may take a stop from text that the whole continuation does not have (a stop ending in U+FFFD, or
a word decoded without the space before it); its batch then ends early and that row comes back
uncut. The benchmarks' stops (``Question:``, ``\nclass``, ``<|im_end|>``) are whole ASCII words.
"""

from __future__ import annotations

import torch
from lm_eval.models.huggingface import HFLM
from transformers import StoppingCriteria, StoppingCriteriaList

from quantgate.evaluate import decode
from quantgate.runtime.greedy import token_ids

CHECK_EVERY = decode.CHECK_EVERY  # decoding steps between two checks, at most 7 steps late


class StopsEvery(StoppingCriteria):
    """Per row: has the continuation (after the prompt's ``prompt_len`` tokens) reached any of
    ``stops``? Decoded on the host every ``every`` steps; between checks the last answer stands."""

    def __init__(self, tokenizer, stops: list[str], prompt_len: int, every: int = CHECK_EVERY) -> None:
        # an empty stop cuts nothing in lm-eval's post-processing, so it ends nothing here either
        self.tokenizer, self.stops, self.prompt_len, self.every = (
            tokenizer,
            [s for s in stops if s],
            prompt_len,
            every,
        )
        self.done: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        """The rows done so far, as transformers asks each step (one bool per row)."""
        if self.done is None:
            self.done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        if (input_ids.shape[1] - self.prompt_len) % self.every or not self.stops:
            return self.done
        texts = [
            t.rstrip("\ufffd") for t in self.tokenizer.batch_decode(input_ids[:, self.prompt_len :].tolist())
        ]
        hit = torch.tensor([any(s in t for s in self.stops) for t in texts], device=input_ids.device)
        self.done = self.done | hit
        return self.done


class QuantgateHFLM(HFLM):
    """``HFLM`` whose greedy generation is ``decode.generate`` (a static cache, each step one CUDA
    graph on a GPU) with its stop sequences checked by ``StopsEvery``; the rest is lm-eval's
    (``max_length``, the padding and its post-processing). Sampling, and models ``decode`` does
    not cover, go through transformers' ``generate`` with the same stop check."""

    def _model_generate(self, context, max_length: int, stop: list[str], **generation_kwargs):
        # lm-eval's own handling of a temperature of 0 (greedy, without a sampling warning)
        generation_kwargs["temperature"] = generation_kwargs.get("temperature", 0.0)
        do_sample = generation_kwargs.get("do_sample")
        if (temperature := generation_kwargs.get("temperature")) == 0.0 and do_sample is None:
            generation_kwargs["do_sample"] = do_sample = False
        if do_sample is False and temperature == 0.0:
            generation_kwargs.pop("temperature", None)
        criteria = StopsEvery(self.tokenizer, stop, context.shape[1])
        with torch.autocast(
            device_type=self.device.type,
            dtype=self.mixed_precision_dtype,
            enabled=self.mixed_precision_dtype is not None,
        ):
            if not do_sample and decode.supports(self.model):
                eos = token_ids(self.model.generation_config.eos_token_id)
                pad = self.tokenizer.pad_token_id
                return decode.generate(
                    self.model,
                    context,
                    decode.inferred_mask(context, pad, eos),
                    max_new_tokens=max_length - context.shape[1],
                    pad_token_id=pad,
                    eos_token_ids=eos,
                    stop=lambda ids: criteria(ids, None),
                )
            return self.model.generate(
                input_ids=context,
                max_length=max_length,
                stopping_criteria=StoppingCriteriaList([criteria]),
                pad_token_id=self.tokenizer.pad_token_id,
                use_cache=True,
                **generation_kwargs,
            )
