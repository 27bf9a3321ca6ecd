"""A model larger than its device's memory: the decoder layers past a budget stay off the device.

Why accelerate's hooks and not a loader of our own: ``dispatch_model`` is what transformers'
``device_map`` placement itself installs; a layer placed off the device keeps its tensors in
host memory (on a GPU worker) or memory-mapped on disk (on a CPU worker), and its hook copies
them to the device for that layer's forward and drops them after. The modules and kernels are
the ones a resident layer runs, so the numbers are the same bit for bit; only time is spent on
the copies (tests/integration/test_offloaded_eval.py, and BENCHMARKS.md on the H200).

What stays resident whatever the budget: everything outside the decoder's layers (embeddings,
the final norm, the head, the rotary tables). Scoring forms logits on the head's device, and a
tied head must not be split from its embedding. The layers are filled in order; the ones that do
not fit are offloaded, and the evaluation's numerics record how many (``offloaded_layers``).

The placement is computed on the model as the evaluation holds it, after its modules were
swapped (an emulated linear holds float32 values, a native FP8 one its FP8 bytes), so the budget
is measured on what will actually be moved, not on the checkpoint's files.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from quantgate.runtime.errors import UsageError
from quantgate.runtime.units import GB, format_bytes, parse_bytes

# on a GPU, ``auto`` leaves this share of the free memory (at least _RESERVE_MIN) to activations:
# a full window's hidden states, one lm_head chunk's float32 logits (2 GB at a 128k vocabulary), the
# reference's top-k, the KV cache's scales and the kernels' workspace
_RESERVE_SHARE = 0.2
_RESERVE_MIN = 8 * GB


@dataclass(frozen=True)
class Placement:
    """Where each part of a model lives: ``device_map`` for accelerate, and what it offloads."""

    device_map: dict[str, int | str]
    offloaded: int  # decoder layers kept off the device
    layers: int
    limit: int  # bytes the resident part may take
    resident: int  # bytes it takes
    target: str  # "cpu" (host memory, a GPU worker) or "disk" (a CPU worker)

    @property
    def note(self) -> str:
        """The numerics note: what was offloaded, where, and that it changes time, not numbers."""
        where = "host memory" if self.target == "cpu" else "memory-mapped files on disk"
        return (
            f"offload: {self.offloaded} of {self.layers} decoder layers kept in {where} past --max-memory "
            f"{format_bytes(self.limit)} ({format_bytes(self.resident)} resident), each copied to the device "
            "for its forward by accelerate's hooks: the same modules and kernels, so the same numbers"
        )


def budget(value: str | None, device: str | torch.device) -> int | None:
    """``--max-memory`` as bytes the model may take on ``device``: None (the default, nothing
    offloaded); a size ('40GB', '40GiB'); or 'auto', the device's free memory less a reserve for
    activations (a GPU; on the CPU, 'auto' offloads nothing: the host's memory is the limit
    already). A value that is neither is a usage error naming the option."""
    if value is None:
        return None
    if value.strip().lower() == "auto":
        if torch.device(device).type != "cuda":
            return None
        free, _ = torch.cuda.mem_get_info(_main(device))
        return int(free - max(_RESERVE_SHARE * free, _RESERVE_MIN))
    try:
        limit = parse_bytes(value)
    except ValueError as exc:
        raise UsageError("--max-memory", str(exc), "pass a size such as 40GB, or auto") from None
    if limit <= 0:
        raise UsageError("--max-memory", f"{value!r} leaves no memory for the model", "pass a positive size")
    return limit


def _main(device: str | torch.device) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _blocks(model: nn.Module) -> nn.ModuleList:
    """The decoder's layers: the model's largest ``ModuleList`` (every causal LM transformers loads
    keeps its blocks in one)."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m)]
    if not lists:
        raise ValueError(f"{type(model).__name__} has no list of layers to offload")
    return max(
        lists, key=lambda m: sum(p.numel() for p in m.parameters()) + sum(b.numel() for b in m.buffers())
    )


def _parts(model: nn.Module, blocks: nn.ModuleList) -> tuple[list[str], list[str]]:
    """(names of every block, names of the modules beside them that cover the rest of the model)."""
    block_names: list[str] = []
    fixed: list[str] = []

    def walk(prefix: str, module: nn.Module) -> None:
        own = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        if own:  # accelerate places modules, not loose tensors: keep such a holder whole
            raise ValueError(f"{prefix or type(module).__name__} holds tensors beside its layers")
        for name, child in module.named_children():
            full = f"{prefix}.{name}" if prefix else name
            if child is blocks:
                block_names.extend(f"{full}.{i}" for i in range(len(blocks)))
            elif any(m is blocks for m in child.modules()):
                walk(full, child)
            else:
                fixed.append(full)

    walk("", model)
    return block_names, fixed


def _bytes(module: nn.Module) -> int:
    seen: set[int] = set()
    total = 0
    for t in (*module.parameters(), *module.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def plan(model: nn.Module, device: str | torch.device, limit: int) -> Placement | None:
    """The placement keeping ``model`` within ``limit`` bytes on ``device``: everything beside the
    layers, then as many layers, in order, as fit. None when the whole model fits (nothing to hook).
    A ``UsageError`` when the part that always stays resident does not fit."""
    main = _main(device)
    blocks = _blocks(model)
    block_names, fixed = _parts(model, blocks)
    resident = sum(_bytes(model.get_submodule(name)) for name in fixed)
    sizes = [_bytes(block) for block in blocks]
    if resident + sum(sizes) <= limit:
        return None
    if resident > limit:
        raise UsageError(
            "--max-memory",
            f"{format_bytes(limit)} is less than the embeddings, final norm and head alone ({format_bytes(resident)}), "
            "which stay on the device",
            f"pass at least {format_bytes(resident + max(sizes))}",
        )
    on = main.index if main.type == "cuda" else "cpu"
    target = "cpu" if main.type == "cuda" else "disk"
    device_map: dict[str, int | str] = dict.fromkeys(fixed, on)
    kept, full = 0, False
    for name, size in zip(block_names, sizes, strict=True):
        full = full or resident + size > limit  # in order: the first layer that does not fit ends it
        device_map[name] = target if full else on
        if not full:
            resident += size
            kept += 1
    return Placement(
        device_map=device_map,
        offloaded=len(blocks) - kept,
        layers=len(blocks),
        limit=limit,
        resident=resident,
        target=target,
    )


@contextmanager
def said_when_too_large(path: Path, device: str | torch.device) -> Iterator[None]:
    """A load that runs out of the device's memory, as the usage error it is: the model at
    ``path`` needs ``--max-memory`` (a bare CUDA out-of-memory error names neither)."""
    try:
        yield
    except torch.OutOfMemoryError:
        raise UsageError(
            "--max-memory",
            f"{path} does not fit the memory of {device}",
            "pass --max-memory auto to keep the decoder layers that do not fit in host memory",
        ) from None


def place(model: nn.Module, placement: Placement, device: str | torch.device) -> nn.Module:
    """``model`` (on the CPU, every module in its final form) dispatched by ``placement``: resident
    parts moved to ``device``, the rest held off it behind accelerate's hooks. Buffers are offloaded
    too: an evaluation's quantized linears keep their weights as buffers. A disk offload's files live
    in a temporary directory removed with the model."""
    from accelerate import dispatch_model

    offload_dir = None
    if placement.target == "disk":
        offload_dir = tempfile.mkdtemp(prefix="quantgate-offload-")
        weakref.finalize(model, shutil.rmtree, offload_dir, True)
    return dispatch_model(
        model,
        device_map=placement.device_map,
        # as a string: accelerate tells the CPU from a GPU by comparing it with "cpu", which a
        # torch.device never equals (every CPU-placed part would be offloaded too)
        main_device=str(_main(device)),
        offload_buffers=True,
        offload_dir=offload_dir,
    )
