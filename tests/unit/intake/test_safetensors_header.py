"""The strict header reader: a sound file reads back exactly; each hostile file has its own error."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from quantgate.intake.safetensors_header import read_header
from quantgate.runtime.errors import CorruptSafetensorsError

pytestmark = pytest.mark.unit


def hostile(path: Path, header: dict | bytes, data: bytes = b"", *, declared: int | None = None) -> Path:
    """Write a safetensors-like file by hand: length prefix, header bytes, data."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if declared is None else declared) + raw + data)
    return path


def entry(dtype: str = "F32", shape: list | None = None, offsets: list | None = None) -> dict:
    return {"dtype": dtype, "shape": [2] if shape is None else shape, "data_offsets": offsets or [0, 8]}


def refused(path: Path, *phrases: str) -> str:
    with pytest.raises(CorruptSafetensorsError) as caught:
        read_header(path)
    message = str(caught.value)
    assert str(path) in message and "Fix:" in message
    for phrase in phrases:
        assert phrase in message, message
    return message


def test_reads_a_sound_file(tmp_path):
    path = tmp_path / "ok.safetensors"
    save_file(
        {
            "a": torch.zeros(3, 4, dtype=torch.bfloat16),
            "b": torch.ones(5, dtype=torch.float32),
            "empty": torch.zeros(0),
        },
        path,
        metadata={"format": "pt"},
    )
    header = read_header(path)
    assert header.metadata == {"format": "pt"}
    assert set(header.tensors) == {"a", "b", "empty"}
    a = header.tensors["a"]
    assert (a.dtype, a.shape, a.nbytes, a.numel) == ("BF16", (3, 4), 24, 12)
    assert header.tensors["b"].shape == (5,) and header.tensors["b"].nbytes == 20
    assert header.data_offset + sum(t.nbytes for t in header.tensors.values()) == path.stat().st_size


def test_sub_byte_dtype_spans_half_a_byte_per_element(tmp_path):
    path = hostile(tmp_path / "f4.safetensors", {"q": entry("F4", [2, 4], [0, 4])}, b"\0" * 4)
    assert read_header(path).tensors["q"].nbytes == 4
    odd = hostile(tmp_path / "odd.safetensors", {"q": entry("F4", [3], [0, 2])}, b"\0" * 2)
    refused(odd, "'q'", "not a whole number of bytes")


def test_reads_only_the_header(tmp_path):
    """A 1 GiB sparse file reads in no time: the data section is never touched."""
    path = hostile(tmp_path / "big.safetensors", {"w": entry("U8", [1 << 30], [0, 1 << 30])})
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size + (1 << 30))
    assert read_header(path).tensors["w"].nbytes == 1 << 30


def test_shorter_than_eight_bytes(tmp_path):
    path = tmp_path / "tiny.safetensors"
    path.write_bytes(b"\x01\x02\x03")
    refused(path, "shorter than 8 bytes")


def test_header_longer_than_the_file(tmp_path):
    path = hostile(tmp_path / "h.safetensors", {"a": entry()}, b"\0" * 8, declared=10_000)
    refused(path, "header longer than the file", "truncated")


def test_header_over_the_safetensors_limit(tmp_path):
    path = hostile(tmp_path / "h.safetensors", b"{}", declared=200_000_000)
    refused(path, "exceeds the 100,000,000-byte limit")


def test_truncated_file_reports_offsets_past_the_end(tmp_path):
    path = tmp_path / "cut.safetensors"
    save_file({"a": torch.ones(64), "b": torch.ones(64)}, path)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 100)
    refused(path, "offsets past the end of the file", "'b'")


def test_header_not_utf8(tmp_path):
    refused(hostile(tmp_path / "u.safetensors", b'{"\xff\xfe": 1}'), "not valid UTF-8")


@pytest.mark.parametrize("raw", [b"{not json", b'{"a": ', b""])
def test_header_not_json(tmp_path, raw):
    refused(hostile(tmp_path / "j.safetensors", raw), "not valid JSON")


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"text"', b"7"])
def test_header_not_an_object(tmp_path, raw):
    refused(hostile(tmp_path / "o.safetensors", raw), "not an object")


def test_duplicate_tensor_name(tmp_path):
    one = b'{"dtype": "U8", "shape": [1], "data_offsets": [%d, %d]}'
    raw = b'{"a": ' + one % (0, 1) + b', "a": ' + one % (1, 2) + b"}"
    refused(hostile(tmp_path / "d.safetensors", raw, b"\0\0"), "names 'a' twice")


@pytest.mark.parametrize("metadata", [["x"], {"format": 1}])
def test_metadata_not_strings(tmp_path, metadata):
    refused(hostile(tmp_path / "m.safetensors", {"__metadata__": metadata}), "'__metadata__'")


def test_entry_not_an_object(tmp_path):
    refused(hostile(tmp_path / "e.safetensors", {"a": [1, 2]}), "'a'", "not an object")


def test_entry_missing_a_field(tmp_path):
    refused(
        hostile(tmp_path / "e.safetensors", {"a": {"dtype": "F32", "shape": [2]}}, b"\0" * 8),
        "'a'",
        "'data_offsets'",
    )


@pytest.mark.parametrize("dtype", ["F128", "float32", 7])
def test_unknown_dtype(tmp_path, dtype):
    refused(hostile(tmp_path / "t.safetensors", {"a": entry(dtype)}, b"\0" * 8), "'a'", "unknown dtype")


@pytest.mark.parametrize("shape", [[-1], [2.0], [True], "2", [[2]], {"0": 2}])
def test_shape_not_non_negative_ints(tmp_path, shape):
    refused(
        hostile(tmp_path / "s.safetensors", {"a": entry(shape=shape)}, b"\0" * 8),
        "'a'",
        "non-negative integers",
    )


@pytest.mark.parametrize("offsets", [[8], [0, 8, 9], [0.0, 8], [-1, 8], "0,8", [False, 8]])
def test_data_offsets_not_two_ints(tmp_path, offsets):
    refused(
        hostile(tmp_path / "o.safetensors", {"a": entry(offsets=offsets)}, b"\0" * 8),
        "'a'",
        "two non-negative integers",
    )


def test_data_offsets_begin_after_end(tmp_path):
    refused(
        hostile(tmp_path / "o.safetensors", {"a": entry(offsets=[8, 0])}, b"\0" * 8),
        "'a'",
        "begin is after end",
    )


def test_offsets_past_the_end(tmp_path):
    path = hostile(tmp_path / "p.safetensors", {"a": entry(shape=[4], offsets=[0, 16])}, b"\0" * 8)
    refused(path, "'a'", "offsets past the end of the file")


def test_byte_span_differs_from_shape(tmp_path):
    path = hostile(tmp_path / "b.safetensors", {"a": entry(shape=[3], offsets=[0, 8])}, b"\0" * 8)
    refused(path, "'a'", "spans 8 bytes", "needs 12")


def test_overlapping_tensors(tmp_path):
    header = {"a": entry(offsets=[0, 8]), "b": entry(offsets=[4, 12])}
    refused(hostile(tmp_path / "o.safetensors", header, b"\0" * 12), "'a'", "'b'", "overlap")


def test_gap_between_tensors(tmp_path):
    header = {"a": entry(offsets=[0, 8]), "b": entry(offsets=[12, 20])}
    refused(hostile(tmp_path / "g.safetensors", header, b"\0" * 20), "4 unused bytes after tensor 'a'")


def test_gap_at_the_start(tmp_path):
    refused(hostile(tmp_path / "g.safetensors", {"a": entry(offsets=[4, 12])}, b"\0" * 12), "at the start")


def test_trailing_bytes(tmp_path):
    refused(hostile(tmp_path / "t.safetensors", {"a": entry()}, b"\0" * 11), "3 trailing bytes")
