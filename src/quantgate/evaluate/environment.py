"""What outside an evaluation's inputs changes its numbers, named so it can key every cache.

The same bytes evaluated twice on one machine give the same metrics bit for bit; across machines
they need not. torch's CPU reductions split work by intra-op thread count, and ATen/oneDNN pick
kernels by instruction set (AVX2, AVX-512, AMX: different bf16 accumulation orders); the fused
pass (``QUANTGATE_COMPILE``) rounds differently from the eager one. A cached source reference
paired with an artifact scored under other switches would report that difference as
quantization error, so the switches are part of the reference cache key, the flow's evaluation
cache keys (``RunPlan.eval_env``) and ``run.json``, and parts evaluated under different switches
are not merged into one evaluation.
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

from quantgate.evaluate import fusion

# the instruction-set extensions that select different CPU kernels for bf16/fp32 matmuls and reductions
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx512_fp16", "amx_bf16", "amx_tile")
THREADS_ENV = "OMP_NUM_THREADS"


@functools.cache
def cpu_features(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, ...]:
    """The kernel-selecting flags of this CPU, sorted; empty where the platform does not say.

    Read once per process: every reference lookup keys on it, and the CPU does not change."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return ()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            return tuple(sorted(f for f in KERNEL_FLAGS if f in flags))
    return ()


def threads() -> int:
    """The intra-op thread count evaluations start with: ``$OMP_NUM_THREADS``, else the CPUs this process may use."""
    value = os.environ.get(THREADS_ENV, "").strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover  (platforms without affinity)
        return os.cpu_count() or 1


def switches() -> dict[str, str]:
    """Every evaluation-numerics switch of this process, as plain strings (a cache key's part).

    ``kernels`` is the instruction set ATen dispatches to: the CPU's best, or less where
    ``$ATEN_CPU_CAPABILITY`` caps it (``avx2`` on an AVX-512 machine gives another machine's numbers).
    ``cpu_bf16_gemm`` is how a CPU evaluation multiplies bf16 linears (``numerics.cpu_gemm``).
    """
    import torch

    from quantgate.numerics import CPU_BF16_GEMM

    return {
        "compile": fusion.setting(),
        "threads": str(threads()),
        "cpu": ",".join(cpu_features()) or "unknown",
        "kernels": torch.backends.cpu.get_cpu_capability(),
        "machine": platform.machine(),
        "cpu_bf16_gemm": CPU_BF16_GEMM,
    }


def recorded() -> dict[str, str | int]:
    """``switches()`` and what torch itself reports, for ``run.json``."""
    import torch

    return {**switches(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__}
