"""Fused elementwise work for long teacher-forced passes, through ``torch.compile``.

Why: on CPU the decoder's projections and the lm_head already run near the machine's bf16 peak;
what is left between them is elementwise work (RMSNorm's float32 round trip, SiLU times the up
projection, the log-sum-exp over the vocabulary), each a separate pass over memory in eager
mode, which inductor fuses into one loop. Compiling costs seconds once per process, so only long
passes compile (``wanted``); compiled and eager passes agree to float rounding
(tests/unit/evaluate/test_scoring.py). Measured gains and compile times: BENCHMARKS.md.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable

import torch
from torch import nn

from quantgate.runtime import sharding
from quantgate.runtime.errors import UsageError

MIN_TOKENS = 65_536
ENV = "QUANTGATE_COMPILE"
_MARK = "_quantgate_fused"
_FUSED_SUFFIXES = ("MLP", "RMSNorm")

# a [n, vocab] chunk of head outputs -> (float32 logits, log-sum-exp per row, largest logit per row)
ChunkStats = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def chunk_stats(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(float32 logits, log-sum-exp per row, largest logit per row) of a [n, vocab] chunk."""
    logits = logits.float()
    top = logits.amax(dim=-1, keepdim=True)
    lse = (logits - top).exp_().sum(dim=-1).log_() + top[:, 0]  # torch.logsumexp, keeping its max
    return logits, lse, top[:, 0]


_compiled_stats: ChunkStats | None = None


def setting() -> str:
    """``QUANTGATE_COMPILE`` as one of "1", "0", "auto". Part of every cached reference's key:
    a fused and an eager pass differ by bf16 rounding, which must not be paired as KLD."""
    value = os.environ.get(ENV, "auto").strip().lower()
    for name, spellings in (("1", ("1", "on", "true")), ("0", ("0", "off", "false")), ("auto", ("auto", ""))):
        if value in spellings:
            return name
    raise UsageError(
        f"${ENV}",
        f"{value!r} is not a setting",
        f"use 1 (always compile), 0 (never) or auto (passes of {MIN_TOKENS}+ tokens)",
    )


def _have_compiler() -> bool:
    # inductor builds its CPU kernels with a C++ compiler ($CXX, else g++)
    return shutil.which(os.environ.get("CXX", "g++")) is not None


def wanted(tokens: int, device: str = "cpu") -> bool:
    """Whether a pass of ``tokens`` scored tokens compiles: ``$QUANTGATE_COMPILE`` 1 always, 0
    never, auto (the default) on the CPU from ``MIN_TOKENS`` up (every ``full`` text suite, no
    ``smoke`` one) where inductor finds a C++ compiler; 1 without a compiler is a UsageError.

    auto never compiles on a GPU: its eager elementwise kernels are a small part of a pass, and
    compiling them cost more than they took (an H200 at 1B: the first full pass, which compiles,
    took 13.6 s against the second's 6.2 s). The decision is a function of the setting, the pass
    and the device, all in the reference's key. A tensor-parallel pass (``sharding``) never
    compiles: its MLP holds the row-wise all-reduce, which inductor would have to trace."""
    if sharding.current() is not None:
        return False
    mode = setting()
    if mode == "1" and not _have_compiler():
        raise UsageError(
            f"${ENV}",
            "is 1 but no C++ compiler was found (torch.compile needs one for CPU kernels)",
            "install g++ (or set $CXX), or set it to auto or 0",
        )
    on_cpu = device == "cpu"
    return mode == "1" or (mode == "auto" and on_cpu and tokens >= MIN_TOKENS and _have_compiler())


def prepare(decoder: nn.Module, tokens: int) -> ChunkStats:
    """Switch ``decoder``'s fusable modules to their compiled form for a long pass, or back to eager
    for a short one; returns the chunk statistics function to use with it.

    Per pass, not once per model: a decoder that served a long suite and then a short one must run
    the short one eagerly, as the same suite's reference (or an artifact evaluated in another
    process) did, so that the decision is a function of the setting and the pass alone. Each
    module is compiled once (``Module.compile``); switching keeps the compiled callable aside.

    Compiled: each decoder layer's MLP and RMSNorms (by class name: they carry no per-layer
    state, so one graph serves every layer) and the per-chunk log-sum-exp. Not attention:
    ``quantgate_tiled``'s loop would be unrolled into the graph, and the attention module holds
    its layer index, which would compile a graph per layer.
    """
    global _compiled_stats
    fused: list[tuple[nn.Module, Callable | None]] | None = getattr(decoder, _MARK, None)
    first = next(decoder.parameters(), None)
    device = first.device.type if first is not None else "cpu"
    if not wanted(tokens, device):
        for module, _ in fused or ():
            module._compiled_call_impl = None  # what Module.compile sets; None is eager
        return chunk_stats
    if fused is None:
        import torch._inductor.config as inductor

        # round bf16 intermediates where eager rounds them, so fused and eager passes agree
        inductor.emulate_precision_casts = True
        fused = []
        for module in decoder.modules():
            if type(module).__name__.endswith(_FUSED_SUFFIXES):
                module.compile(dynamic=None)
                fused.append((module, module._compiled_call_impl))
        setattr(decoder, _MARK, fused)
    for module, compiled in fused:
        module._compiled_call_impl = compiled
    if _compiled_stats is None:
        _compiled_stats = torch.compile(chunk_stats, dynamic=True)
    return _compiled_stats
