"""A model loaded for evaluation decodes greedily, whatever its checkpoint's generation config says.

transformers' ``generate`` (ours, and lm-eval's) starts from the model's generation config, read
from generation_config.json: beam search, sampling, penalties, forced tokens there would change
what every suite measures. ``pin_greedy`` replaces it by plain greedy decoding keeping only the
model's token ids and says what it overrode. Below numerics and evaluation, which both load
models for evaluation; transformers is imported only when a config is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import GenerationConfig

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


def token_ids(value: int | list[int] | None) -> list[int]:
    """A generation config's token id setting (one id, a list of them, or none) as a list."""
    if value is None:
        return []
    return [value] if isinstance(value, int) else list(value)


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
