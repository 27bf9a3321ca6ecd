"""Batched greedy generation, the one way every generation suite produces text.

Left padding, because decoder-only models continue from the last position of each row;
batch size and maximum length come from the suite's profile and are the same for the source
and every artifact, since both change results.

Greedy whatever the checkpoint says: transformers' ``generate`` (ours, and lm-eval's) starts from
the model's generation config, read from the checkpoint's generation_config.json, so a file
saying ``num_beams: 48`` turned every evaluation into beam search (4.7x slower, and the source's
traces changed); sampling, repetition penalties, forced or suppressed tokens and ``max_time``
change what is generated as well. ``quantgate.runtime.greedy.pin_greedy`` replaces it, when a model is
loaded for evaluation, by plain greedy decoding that keeps only the model's token ids (where it
stops, what it pads with), and says what it overrode, a note recorded with every result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from quantgate.evaluate import decode
from quantgate.runtime.greedy import greedy_config, token_ids

if TYPE_CHECKING:
    from quantgate.runtime.progress import Progress


@torch.inference_mode()
def greedy(
    model,
    tokenizer,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    batch_size: int,
    on_batch=None,
    until_leaving: list[list[int]] | None = None,
) -> list[list[int]]:
    """New tokens for each prompt (without the prompt), stopping at EOS.

    ``until_leaving``: a sequence per prompt that the caller only compares the new tokens with
    (long-chain's free run, which measures where an artifact leaves the source's trace). A row
    may then stop once its tokens have left that sequence or run past it: what comes back still
    holds every token up to and including the first one that differs, and the batch ends when
    all its rows have, instead of at ``max_new_tokens`` (an 8B artifact's free run of 64 traces
    took 243 s to the limit on the H200). Rows are checked every ``decode.CHECK_EVERY`` tokens on
    the static-cache path; ``generate``'s fallback runs to the limit.
    """
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    config, decodes = greedy_config(model), decode.supports(model)
    out: list[list[int]] = []
    try:
        for start in range(0, len(prompts), batch_size):
            batch = prompts[start : start + batch_size]
            width = max(len(p) for p in batch)
            ids = torch.full((len(batch), width), pad, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, p in enumerate(batch):
                ids[row, width - len(p) :] = torch.tensor(p)
                mask[row, width - len(p) :] = 1
            if decodes:
                follow = None if until_leaving is None else until_leaving[start : start + batch_size]
                generated = decode.generate(
                    model,
                    ids,
                    mask,
                    max_new_tokens=max_new_tokens,
                    pad_token_id=pad,
                    eos_token_ids=token_ids(config.eos_token_id),
                    stop=None if follow is None else _left(follow, width, max_new_tokens),
                )[:, width:]
            else:
                generated = model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    generation_config=config,
                    max_new_tokens=max_new_tokens,
                    pad_token_id=pad,
                )[:, width:]
            for row in generated.tolist():
                if tokenizer.eos_token_id in row:
                    row = row[: row.index(tokenizer.eos_token_id) + 1]
                while row and row[-1] == pad and pad != tokenizer.eos_token_id:
                    row.pop()
                out.append(row)
            if on_batch:
                on_batch(len(batch))
    finally:
        decode.release(model)
    return out


def _left(follow: list[list[int]], width: int, max_new_tokens: int) -> decode.Stop:
    """A stop rule: which rows' new tokens (after ``width`` prompt columns) have left their
    sequence in ``follow`` or run past its end (-1 there, never a token)."""
    expected = torch.full((len(follow), max_new_tokens), -1, dtype=torch.long)
    for row, seq in enumerate(follow):
        seq = seq[:max_new_tokens]
        expected[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)

    def left(sequences: torch.Tensor) -> torch.Tensor:
        new = sequences[:, width:]
        return (new != expected[:, : new.shape[1]].to(new.device)).any(dim=1)

    return left


def greedy_with_progress(
    progress: Progress,
    description: str,
    model,
    tokenizer,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    batch_size: int,
    until_leaving: list[list[int]] | None = None,
) -> list[list[int]]:
    """``greedy`` as a ``progress`` task of ``description``, one unit a prompt."""
    with progress.task(description, total=len(prompts)) as task:
        return greedy(
            model,
            tokenizer,
            prompts,
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
            on_batch=task.advance,
            until_leaving=until_leaving,
        )


def chat_prompt(tokenizer, text: str) -> list[int]:
    """A user turn in the model's chat template, or the raw text when it has none."""
    if getattr(tokenizer, "chat_template", None):
        return list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": text}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
            )["input_ids"]
        )
    return tokenizer(text)["input_ids"]
