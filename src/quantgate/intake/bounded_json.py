"""The bounds of the JSON a checkpoint holds: the shared bounded reader, checkpoint size limits,
and every number finite.

Every JSON document intake reads (config.json and the other ``*config.json`` files, the shard
index, each safetensors header, the tokenizer's files) comes from the checkpoint's author, and is
read by ``quantgate.runtime.bounded_json`` within size, depth and integer bounds. Intake adds the size
limit of each kind of file, and one more bound: every number must be finite. Python's parser
takes ``NaN``, ``Infinity`` and ``1e999`` (which becomes ``inf``) without a word, and a
``rope_theta`` of NaN built an artifact whose every k/v scale was NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from quantgate.runtime import bounded_json as shared
from quantgate.runtime.bounded_json import MAX_DEPTH, MAX_INT_DIGITS, JsonRefused, read_bytes

__all__ = [
    "CONFIG_BYTES",
    "INDEX_BYTES",
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "SIDE_CONFIG_BYTES",
    "JsonRefused",
    "parse",
    "read_bytes",
]

CONFIG_BYTES = 1024**2  # config.json: real ones are under 50 kB
SIDE_CONFIG_BYTES = 16 * 1024**2  # tokenizer_config.json and kin: chat templates, added tokens
INDEX_BYTES = 64 * 1024**2  # a shard index: DeepSeek-V3's 90,000 tensor names take 9 MB


def parse(text: str | bytes, object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None) -> Any:
    """``quantgate.runtime.bounded_json.parse``, and ``JsonRefused`` for a number that is not finite."""
    value = shared.parse(text, object_pairs_hook=object_pairs_hook)
    number = _first_non_finite(value)
    if number is not None:
        raise JsonRefused(f"holds the number {number}, which is not finite (every number must be)")
    return value


def _first_non_finite(value: Any) -> str | None:
    """``nan``, ``inf`` or ``-inf`` when the parsed value holds one, walked without recursion."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return repr(item)
        if isinstance(item, dict | list):
            children: Iterable[Any] = item.values() if isinstance(item, dict) else item
            stack.extend(children)
    return None
