"""A strict reader for the header of a ``.safetensors`` file.

Why not ``safetensors.safe_open``: it collapses every problem into one exception whose message
is all a caller can match on, and a release engineer reading a CI log deserves to be told which
field of which file is wrong. This reader checks the header field by field as the safetensors
library does (same dtypes, 100 MB header limit, offsets that tile the data section exactly) and
raises one ``CorruptSafetensorsError`` per kind of problem. It reads the length prefix and the
header only, never tensor data: a few kilobytes per shard, however large the checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantgate.intake import bounded_json
from quantgate.runtime.errors import CorruptSafetensorsError

# The safetensors library refuses headers larger than this (``MAX_HEADER_SIZE``).
MAX_HEADER_BYTES = 100_000_000

# dtype as written in the header -> (bits per element, torch-style name, is floating point)
DTYPES: dict[str, tuple[int, str, bool]] = {
    "BOOL": (8, "bool", False),
    "U8": (8, "uint8", False),
    "I8": (8, "int8", False),
    "U16": (16, "uint16", False),
    "I16": (16, "int16", False),
    "U32": (32, "uint32", False),
    "I32": (32, "int32", False),
    "U64": (64, "uint64", False),
    "I64": (64, "int64", False),
    "F4": (4, "float4_e2m1fn_x2", True),
    "F6_E2M3": (6, "float6_e2m3fn", True),
    "F6_E3M2": (6, "float6_e3m2fn", True),
    "F8_E4M3": (8, "float8_e4m3fn", True),
    "F8_E4M3FNUZ": (8, "float8_e4m3fnuz", True),
    "F8_E5M2": (8, "float8_e5m2", True),
    "F8_E5M2FNUZ": (8, "float8_e5m2fnuz", True),
    "F8_E8M0": (8, "float8_e8m0fnu", True),
    "F16": (16, "float16", True),
    "BF16": (16, "bfloat16", True),
    "F32": (32, "float32", True),
    "F64": (64, "float64", True),
    "C64": (64, "complex64", False),
}

_FIX = (
    "re-save the checkpoint with safetensors (e.g. save_pretrained or safetensors.torch.save_file), "
    "or copy it again if the transfer may have been interrupted"
)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's entry: dtype as written in the header, shape, and byte span in the data section."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def numel(self) -> int:
        """Elements in the tensor."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes the tensor spans in the data section."""
        return self.end - self.begin


@dataclass(frozen=True)
class SafetensorsHeader:
    """A validated header; ``data_offset`` is where the data section starts in the file."""

    tensors: dict[str, TensorInfo]
    metadata: dict[str, str] = field(default_factory=dict)
    data_offset: int = 8


def read_header(path: Path) -> SafetensorsHeader:
    """Read and validate the header of ``path``; raise ``CorruptSafetensorsError`` on any flaw."""
    path = Path(path)

    def fail(problem: str) -> CorruptSafetensorsError:
        return CorruptSafetensorsError(path, problem, _FIX)

    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            raise fail(f"file shorter than 8 bytes ({size} bytes): no header length prefix")
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > MAX_HEADER_BYTES:
            raise fail(
                f"header of {header_len:,} bytes exceeds the {MAX_HEADER_BYTES:,}-byte limit of safetensors"
            )
        if header_len > size - 8:
            raise fail(
                f"header longer than the file: it declares {header_len:,} header bytes but only "
                f"{size - 8:,} follow the length prefix (the file is truncated or not safetensors)"
            )
        raw = f.read(header_len)
    data_len = size - 8 - header_len

    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise fail(f"header is not valid UTF-8 (byte {exc.start})") from None
    try:
        parsed = bounded_json.parse(text, object_pairs_hook=_no_duplicate_keys)
    except _DuplicateKey as exc:
        raise fail(f"header names '{exc.key}' twice") from None
    except bounded_json.JsonRefused as exc:
        raise fail(f"header {exc.problem}") from None
    except json.JSONDecodeError as exc:
        raise fail(f"header is not valid JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(parsed, dict):
        raise fail(f"header is a JSON {type(parsed).__name__}, not an object")

    metadata = _metadata(parsed.pop("__metadata__", None), fail)
    tensors = {name: _tensor(name, entry, data_len, fail) for name, entry in parsed.items()}
    _check_tiling(tensors, data_len, fail)
    return SafetensorsHeader(tensors=tensors, metadata=metadata, data_offset=8 + header_len)


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _metadata(value: Any, fail) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise fail("'__metadata__' is not a mapping of strings to strings")
    return dict(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tensor(name: str, entry: Any, data_len: int, fail) -> TensorInfo:
    if not isinstance(entry, dict):
        raise fail(f"entry for tensor '{name}' is not an object")
    for key in ("dtype", "shape", "data_offsets"):
        if key not in entry:
            raise fail(f"tensor '{name}' has no '{key}'")

    dtype = entry["dtype"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise fail(f"tensor '{name}' has unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")

    shape = entry["shape"]
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise fail(f"tensor '{name}' has shape {shape!r}: not a list of non-negative integers")

    offsets = entry["data_offsets"]
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) and o >= 0 for o in offsets)):
        raise fail(f"tensor '{name}' has data_offsets {offsets!r}: not two non-negative integers")
    begin, end = offsets
    if begin > end:
        raise fail(f"tensor '{name}' has data_offsets [{begin}, {end}]: begin is after end")
    if end > data_len:
        raise fail(
            f"tensor '{name}' has offsets past the end of the file: it ends at data byte {end:,} "
            f"but the data section holds {data_len:,} bytes (the file is truncated)"
        )

    bits = DTYPES[dtype][0]
    numel = math.prod(shape)
    if (numel * bits) % 8:
        raise fail(f"tensor '{name}' of {numel} {dtype} elements is not a whole number of bytes")
    expected = numel * bits // 8
    if end - begin != expected:
        raise fail(
            f"tensor '{name}' spans {end - begin:,} bytes but shape {shape} of {dtype} needs {expected:,}"
        )
    return TensorInfo(dtype=dtype, shape=tuple(shape), begin=begin, end=end)


def _check_tiling(tensors: dict[str, TensorInfo], data_len: int, fail) -> None:
    """Tensors must tile the data section exactly: no overlap, no gap, no trailing bytes."""
    ordered = sorted(tensors.items(), key=lambda item: (item[1].begin, item[1].end))
    position, previous = 0, None
    for name, info in ordered:
        if info.begin < position:
            raise fail(
                f"tensors '{previous}' and '{name}' overlap "
                f"(bytes {info.begin:,} to {position:,} of the data section)"
            )
        if info.begin > position:
            where = f"after tensor '{previous}'" if previous else "at the start of the data section"
            raise fail(f"{info.begin - position:,} unused bytes {where}: offsets are not contiguous")
        position, previous = info.end, name
    if position != data_len:
        raise fail(f"{data_len - position:,} trailing bytes after the last tensor")
