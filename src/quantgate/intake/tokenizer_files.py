"""The tokenizer's files: bounded, loadable, and consistent with the model they feed.

Every step after intake loads the tokenizer (KV calibration, evaluation, a serving engine), so a
hostile one failed late and expensively: a 110 MB ``tokenizer.json`` cost 3.3 GB and 56 s each
time it was loaded; a pre-tokenizer regex that backtracks catastrophically made Oniguruma give up
inside the Rust tokenizer, which panicked the build; a token id past config.json's
``vocab_size`` (a vocabulary larger than the embedding, an EOS the vocabulary lacks, which
transformers adds with a new id) ended in an ``IndexError`` in the embedding; a
``special_tokens_map.json`` nested 60,000 deep in a ``RecursionError``. Here, before any of that:

- every tokenizer file is bounded in size, and the JSON ones are read within ``bounded_json``'s
  depth, integer and finiteness bounds;
- ``tokenizer.json`` is parsed and loaded by the ``tokenizers`` library in a child under CPU and
  memory limits (``bounded_child``), and each regular expression it holds (pre-tokenizer
  ``Split``, normalizer and decoder ``Replace``) is run by the same engine on adversarial probes
  (``regex_probes``);
- every token id the tokenizer can produce, and each id config.json and generation_config.json
  give generation (BOS, EOS, padding), must be a row of the embedding (``0 <= id < vocab_size``);
  every special token that tokenizer_config.json or special_tokens_map.json names must be in the
  vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from quantgate.intake import bounded_child, bounded_json, regex_probes
from quantgate.intake.architecture import read_json
from quantgate.intake.tree import excerpt
from quantgate.runtime.errors import CheckpointConfigError

TOKENIZER_JSON = "tokenizer.json"
# Real tokenizer.json files: Llama-3 9 MB, Qwen2 7 MB, Gemma-3 (262k tokens) 33 MB
TOKENIZER_BYTES = 64 * 1024**2
# other files transformers' tokenizers read, and their bounds (sentencepiece models are under 5 MB)
_SIZE_BOUNDED = {"tokenizer.model": 64 * 1024**2, "merges.txt": 64 * 1024**2}
_JSON_BOUNDED = ("special_tokens_map.json", "added_tokens.json", "vocab.json")
# The child parses and loads a tokenizer.json of up to 64 MiB: a 47 MiB one of 2.3 M tokens took
# 17 s of CPU and 820 MB here; the wall-clock limit leaves room for a machine whose cores are busy.
LIMITS = bounded_child.Limits(cpu_seconds=60, memory_bytes=3 * 1024**3, wall_seconds=300.0)
# ids generation feeds into the model or stops on: each must be a row of the embedding
GENERATION_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
# special-token fields of tokenizer_config.json and special_tokens_map.json
_SPECIAL_FIELDS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
_SPECIAL_LISTS = ("additional_special_tokens", "extra_special_tokens")
_FIX = "use the tokenizer files the model was released with"


def check_bounds(root: Path, files: list[str]) -> None:
    """Refuse (CheckpointConfigError, exit 2) a tokenizer file over its size limit, or a JSON one
    outside ``bounded_json``'s bounds: cheap, so intake runs it before reading any weights."""
    present = set(files)
    for rel, limit in {**_SIZE_BOUNDED, TOKENIZER_JSON: TOKENIZER_BYTES}.items():
        if rel in present:
            _refuse_oversized(root / rel, rel, limit)
    for rel in _JSON_BOUNDED:
        if rel in present:
            read_json(root / rel, rel)


def check(root: Path, files: list[str], vocab_size: int | None) -> None:
    """Refuse (CheckpointConfigError, exit 2) the first tokenizer file that does not load, holds a
    regex that backtracks without end, or names a token the embedding has no row for (after
    ``check_bounds``, once config.json's ``vocab_size`` is known)."""
    present = set(files)
    side = {rel: read_json(root / rel, rel) for rel in _JSON_BOUNDED if rel in present}
    if vocab_size is not None:
        for rel in ("config.json", "generation_config.json"):
            if rel in present:
                _check_generation_ids(root / rel, rel, read_json(root / rel, rel), vocab_size)
    if TOKENIZER_JSON not in present:
        return
    path = root / TOKENIZER_JSON
    specials = _special_tokens(root, present, side)
    summary = _inspect(path, sorted({token for token, _ in specials}))
    if vocab_size is not None and summary["max_id"] is not None and summary["max_id"] >= vocab_size:
        raise CheckpointConfigError(
            path,
            f"tokenizer.json holds token id {summary['max_id']:,} ({excerpt(summary['max_token'])}), but "
            f"config.json's vocab_size is {vocab_size:,}: the embedding has no row for it",
            f"{_FIX}, or the config.json whose vocab_size covers its {summary['size']:,} tokens",
        )
    for token, declared_in in specials:
        if summary["ids"].get(token) is None:
            raise CheckpointConfigError(
                root / declared_in,
                f"{declared_in} names the special token {excerpt(token)}, which is not in tokenizer.json's "
                "vocabulary (transformers would add it with an id the model was never trained on)",
                _FIX,
            )


def _refuse_oversized(path: Path, rel: str, limit: int) -> None:
    size = path.stat().st_size
    if size > limit:
        raise CheckpointConfigError(
            path, f"{rel} is {size:,} bytes, over the {limit:,}-byte limit for this file", _FIX
        )


def _check_generation_ids(path: Path, rel: str, config: dict[str, Any], vocab_size: int) -> None:
    """Each of ``GENERATION_IDS`` (an integer or a list of them), top level and ``text_config``."""
    text = config.get("text_config")
    for where, part in (("", config), ("text_config.", text if isinstance(text, dict) else {})):
        for key in GENERATION_IDS:
            value = part.get(key)
            for token_id in value if isinstance(value, list) else [value]:
                if token_id is None:
                    continue
                if (
                    not isinstance(token_id, int)
                    or isinstance(token_id, bool)
                    or not 0 <= token_id < vocab_size
                ):
                    raise CheckpointConfigError(
                        path,
                        f"{rel} sets {where}{key} to {excerpt(token_id)}, not a token id of the model "
                        f"(0 to {vocab_size - 1:,}, config.json's vocab_size - 1)",
                        f"set {key} to the id the tokenizer gives that token",
                    )


def _special_tokens(root: Path, present: set[str], side: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
    """(token, file naming it) for every special token of tokenizer_config.json and special_tokens_map.json."""
    found: list[tuple[str, str]] = []
    sources = dict(side)
    if "tokenizer_config.json" in present:
        sources["tokenizer_config.json"] = read_json(root / "tokenizer_config.json", "tokenizer_config.json")
    for rel in ("tokenizer_config.json", "special_tokens_map.json"):
        config = sources.get(rel)
        if config is None:
            continue
        values = [config.get(field) for field in _SPECIAL_FIELDS]
        for field in _SPECIAL_LISTS:
            listed = config.get(field)
            values.extend(listed.values() if isinstance(listed, dict) else listed or [])
        for value in values:
            token = value.get("content") if isinstance(value, dict) else value
            if isinstance(token, str):
                found.append((token, rel))
    return found


def _inspect(path: Path, specials: list[str]) -> dict[str, Any]:
    """What the child found in tokenizer.json; CheckpointConfigError for what it could not take."""
    outcome = bounded_child.run(lambda: _summary(path, specials), LIMITS)
    if outcome.failure in ("cpu", "wall"):
        problem = (
            f"loading tokenizer.json and running its regular expressions on test text took more than "
            f"{LIMITS.cpu_seconds} s of CPU time (stopped: {outcome.detail})"
        )
    elif outcome.failure == "memory":
        problem = f"loading tokenizer.json needed more than {LIMITS.memory_bytes // 1024**2:,} MiB"
    elif outcome.failure is not None:
        problem = f"tokenizer.json cannot be loaded or used ({excerpt(outcome.detail, 240, quote=False)})"
    elif outcome.value.get("problem"):
        problem = outcome.value["problem"]
    else:
        return outcome.value
    raise CheckpointConfigError(path, problem, _FIX)


def _summary(path: Path, specials: list[str]) -> dict[str, Any]:
    """In the child: tokenizer.json parsed within bounds, each regex probed, then loaded by tokenizers.

    ``{"problem": ...}`` for what is wrong with it, else its size, largest id and the ids of ``specials``.
    """
    from tokenizers import Tokenizer

    try:
        text = bounded_json.read_bytes(path, TOKENIZER_BYTES).decode("utf-8")
        data = bounded_json.parse(text)
    except bounded_json.JsonRefused as exc:
        return {"problem": f"tokenizer.json {exc.problem}"}
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return {"problem": f"tokenizer.json is not valid JSON ({excerpt(exc, 200, quote=False)})"}
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        return {"problem": "tokenizer.json is not a tokenizers file (no 'model' object)"}
    for where, pattern in regex_probes.patterns(data):
        problem = regex_probes.check(pattern)
        if problem is not None:
            return {"problem": f"tokenizer.json's {where} regex {excerpt(pattern, 120)} {problem}"}
    model_max = _largest_model_id(data["model"])
    del data  # the parsed copy: the library keeps its own
    try:
        tokenizer = Tokenizer.from_str(text)
    except Exception as exc:  # noqa: BLE001  the library's own refusal, worded by it
        return {
            "problem": f"the tokenizers library cannot load tokenizer.json ({excerpt(exc, 200, quote=False)})"
        }
    del text
    for probe in regex_probes.PROBES:
        tokenizer.encode(probe)  # the whole pipeline on the same text: a panic here propagates
    # added tokens get their ids from the library (it renumbers some), the model's are as written
    max_id = max([model_max, *tokenizer.get_added_tokens_decoder()], default=-1)
    return {
        "size": tokenizer.get_vocab_size(with_added_tokens=True),
        "max_id": max_id if max_id >= 0 else None,
        "max_token": tokenizer.id_to_token(max_id) if max_id >= 0 else None,
        "ids": {token: tokenizer.token_to_id(token) for token in specials},
    }


def _largest_model_id(model: dict[str, Any]) -> int:
    """The largest id of the model's own vocabulary: a ``{token: id}`` object (BPE, WordPiece,
    WordLevel) or a list of ``[token, score]`` pairs, numbered in order (Unigram); -1 when empty."""
    vocab = model.get("vocab")
    if isinstance(vocab, dict):
        return max((v for v in vocab.values() if isinstance(v, int)), default=-1)
    return len(vocab) - 1 if isinstance(vocab, list) else -1
