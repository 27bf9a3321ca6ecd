"""JSON written by someone else, read within bounds: file size, nesting depth, integer length.

Every JSON document quantgate reads from outside (a checkpoint's config.json and other
``*config.json`` files, its shard index, each safetensors header, a gate report downloaded from
the registry) comes from whoever wrote it. Python's parser fails on hostile input in ways that
are not ``JSONDecodeError``: nesting deeper than the interpreter's recursion limit raises
``RecursionError``, an integer of more than 4,300 digits raises ``ValueError`` (CPython's
int-to-string limit), and a file is read whole however large it is. Here each of those is one
refusal with its own sentence, and values that parse but nest deeper than any real file does
are refused too, so that code reading the value later (transformers' config classes, pydantic
models) never meets them. Each reader chooses its size limit (``read_bytes``).

Shared by intake (``intake/bounded_json.py`` keeps the checkpoint files' limits) and
``report_schema`` (a report.json nested 100,000 deep crashed ``quantgate gate``); it lives at
the top level so that reading a report does not import intake, and with it torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

# Real checkpoint files nest 4-6 levels (a multimodal config's sub-configs, rope parameters, a
# chat template list), gate reports 7; 32 leaves room for any of them and is far below the
# recursion limit.
MAX_DEPTH = 32
# No size, count or byte offset needs more than 2**64's 20 digits, but transformers writes
# tokenizer_config.json's model_max_length as int(1e30), 31 digits; far below CPython's 4,300.
MAX_INT_DIGITS = 40


class JsonRefused(ValueError):
    """The document breaks a bound; ``problem`` says which, in words for an error message."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(problem)


class _LongInteger(Exception):
    def __init__(self, digits: int) -> None:
        self.digits = digits


def _bounded_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise _LongInteger(digits)
    return int(text)


def parse(text: str | bytes, object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None) -> Any:
    """``json.loads`` within the bounds; ``JsonRefused`` when one is broken.

    ``json.JSONDecodeError`` (malformed JSON) passes through for the caller to word.
    """
    try:
        value = json.loads(text, parse_int=_bounded_int, object_pairs_hook=object_pairs_hook)
    except RecursionError:
        raise JsonRefused(
            f"nested deeper than Python's JSON parser can follow (at most {MAX_DEPTH} levels allowed)"
        ) from None
    except _LongInteger as exc:
        raise JsonRefused(
            f"holds an integer of {exc.digits:,} digits (at most {MAX_INT_DIGITS} allowed)"
        ) from None
    depth = _depth(value)
    if depth > MAX_DEPTH:
        raise JsonRefused(f"nested {depth} levels deep (at most {MAX_DEPTH} allowed)")
    return value


def _depth(value: Any) -> int:
    """Nesting depth of a parsed value, walked without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            children: Iterable[Any] = item.values() if isinstance(item, dict) else item
        else:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children)
    return deepest


def read_bytes(path: Path, max_bytes: int) -> bytes:
    """The file's bytes; ``JsonRefused`` when it holds more than ``max_bytes`` (nothing more is read)."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        data = fh.read(max_bytes + 1) if size <= max_bytes else b""
    if size > max_bytes or len(data) > max_bytes:
        raise JsonRefused(
            f"is {max(size, len(data)):,} bytes, over the {max_bytes:,}-byte limit for this file"
        )
    return data
