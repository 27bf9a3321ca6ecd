"""Batched greedy generation, the one way every generation suite produces text.

Left padding, because decoder-only models continue from the last position of each row;
batch size and maximum length come from the suite's profile and are the same for the source
and every artifact, since both change results.

Greedy whatever the checkpoint says: transformers' ``generate`` (ours, and lm-eval's) starts from
the model's generation config, read from the checkpoint's generation_config.json, so a file
saying ``num_beams: 48`` turned every evaluation into beam search (4.7x slower, and the source's
traces changed); sampling, repetition penalties, forced or suppressed tokens and ``max_time``
change what is generated as well. ``pin_greedy`` replaces it, when a model is loaded for
evaluation, by plain greedy decoding that keeps only the model's token ids (where it stops, what
it pads with), and says what it overrode, a note recorded with every result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import GenerationConfig

    from quantgate.progress import Progress

# what generation keeps from the model's own generation config: where it stops, what it pads with
TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
# settings replaced too, but not named in the note: they change what generate returns or how it
# caches (save_pretrained writes some of them), never which tokens it picks
_UNNAMED = frozenset(
    {
        "use_cache",
        "output_attentions",
        "output_hidden_states",
        "output_scores",
        "output_logits",
        "transformers_version",
    }
)


def greedy_config(model) -> GenerationConfig:
    """Plain greedy decoding (one beam, no sampling, no logits processors) with ``model``'s token ids."""
    from transformers import GenerationConfig

    found = getattr(model, "generation_config", None)
    return GenerationConfig(
        do_sample=False, num_beams=1, **{key: getattr(found, key, None) for key in TOKEN_IDS}
    )


def pin_greedy(model) -> str:
    """Make ``model.generation_config`` plain greedy decoding; the note recorded with its results
    names every setting of the checkpoint's that this overrode."""
    found = getattr(model, "generation_config", None)
    pinned = greedy_config(model)
    said = found.to_diff_dict() if found is not None else {}
    overridden = {
        key: value
        for key, value in sorted(said.items())
        if key not in TOKEN_IDS
        and key not in _UNNAMED
        and not key.startswith("_")
        and getattr(pinned, key, None) != value
    }
    model.generation_config = pinned
    shown = ", ".join(f"{key}={value!r}" for key, value in overridden.items())
    greedy = "generation: greedy (num_beams=1, do_sample=False, no logits processors)"
    if shown:
        return f"{greedy}, overriding the checkpoint's generation config: {shown}"
    return f"{greedy}; the checkpoint's generation config asked for nothing else"


@torch.inference_mode()
def greedy(
    model, tokenizer, prompts: list[list[int]], *, max_new_tokens: int, batch_size: int, on_batch=None
) -> list[list[int]]:
    """New tokens for each prompt (without the prompt), stopping at EOS."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out: list[list[int]] = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, p in enumerate(batch):
            ids[row, width - len(p) :] = torch.tensor(p)
            mask[row, width - len(p) :] = 1
        generated = model.generate(
            input_ids=ids,
            attention_mask=mask,
            generation_config=greedy_config(model),
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
    return out


def greedy_with_progress(
    progress: Progress,
    description: str,
    model,
    tokenizer,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    batch_size: int,
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
