"""Positioned reads and writes of safetensors shards, for engines that stream tensor by tensor.

Why not ``safetensors.torch.load_file``/``save_file``: both hold a whole shard in memory (and
``save_file`` a second, serialized copy while writing), and ``safe_open`` maps the file, so every
page it touches counts as resident memory until the shard is closed. A safetensors file is a
JSON header followed by raw bytes at fixed offsets, so once an engine knows every output
tensor's dtype and shape it can write the header first and then fill the data section in any
order, from several threads, with ``pwrite``. Memory is then a few tensors, not a shard, and
tensors copied unchanged never enter user space at all (``copy_file_range``).
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass

import torch

# safetensors dtype names <-> torch dtypes (the subset checkpoints use)
DTYPES: dict[str, torch.dtype] = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_ITEMSIZE = {name: torch.empty((), dtype=dt).element_size() for name, dt in DTYPES.items()}


@dataclass(frozen=True)
class OutTensor:
    """One tensor of an output shard: its name, safetensors dtype and shape."""

    name: str
    dtype: str  # safetensors dtype name
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Bytes the tensor takes in the data section."""
        return math.prod(self.shape) * _ITEMSIZE[self.dtype]


class ShardWriter:
    """An output shard whose layout is fixed up front; tensors are then written at their offsets.

    The header is padded with spaces to a multiple of 8 bytes, as the safetensors writer does,
    so that every tensor starts 8-byte aligned for readers that map the file.
    """

    def __init__(self, path: str | os.PathLike, tensors: list[OutTensor], metadata: dict[str, str]) -> None:
        header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
        self.offsets: dict[str, int] = {}
        position = 0
        for t in tensors:
            header[t.name] = {
                "dtype": t.dtype,
                "shape": list(t.shape),
                "data_offsets": [position, position + t.nbytes],
            }
            self.offsets[t.name] = position
            position += t.nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        self.data_offset = 8 + len(raw)
        self.data_bytes = position
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            # the final size up front (sparse), so writers at any offset never extend the file;
            # not posix_fallocate: writing into its reserved extents was slower (BENCHMARKS.md)
            os.ftruncate(self.fd, self.data_offset + position)
            write_all(self.fd, struct.pack("<Q", len(raw)) + raw, 0)
        except BaseException:
            os.close(self.fd)
            raise

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Write ``tensor``'s bytes at ``name``'s offset."""
        write_all(self.fd, as_bytes(tensor), self.data_offset + self.offsets[name])

    def copy_from(self, name: str, src_fd: int, src_offset: int, nbytes: int) -> None:
        """Copy ``name``'s bytes from another file at ``src_offset``, inside the kernel where possible."""
        copy_range(src_fd, src_offset, self.fd, self.data_offset + self.offsets[name], nbytes)

    def close(self) -> None:
        """Close the shard's file descriptor."""
        os.close(self.fd)


def as_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes, without a copy (numpy has no bf16/fp8, so view them as uint8)."""
    flat = tensor.contiguous().reshape(-1).view(torch.uint8)
    return flat.numpy().data.cast("B")


def read_into(fd: int, buffer: torch.Tensor, offset: int) -> None:
    """Fill a uint8 tensor from ``fd`` at ``offset`` (``preadv`` releases the GIL)."""
    view = buffer.numpy().data.cast("B")
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            raise EOFError(f"file ended {len(view) - done} bytes early at offset {offset + done}")
        done += n


def write_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset`` (``pwrite`` may write less than asked)."""
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)


def copy_range(src_fd: int, src_offset: int, dst_fd: int, dst_offset: int, nbytes: int) -> None:
    """Copy bytes between files inside the kernel; fall back to a buffered copy where unsupported."""
    done = 0
    try:
        while done < nbytes:
            n = os.copy_file_range(src_fd, dst_fd, nbytes - done, src_offset + done, dst_offset + done)
            if n == 0:
                raise EOFError(f"source ended {nbytes - done} bytes early at offset {src_offset + done}")
            done += n
    except OSError:  # e.g. EXDEV or ENOSYS on older kernels and some filesystems
        chunk = 16 * 1024**2
        while done < nbytes:
            data = os.pread(src_fd, min(chunk, nbytes - done), src_offset + done)
            if not data:
                raise EOFError(f"source ended {nbytes - done} bytes early") from None
            write_all(dst_fd, data, dst_offset + done)
            done += len(data)
