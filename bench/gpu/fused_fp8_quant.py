"""Issue 27: the fused per-token FP8 activation quantization (``numerics/fp8_quant_cuda.py``, what
``native.quantize_per_token`` runs on CUDA) timed against the eager torch operations it replaced,
at an 8B layer's two input widths, and checked for the same bits on the same input.

Usage on a GPU (prints the timings; exit 1 if any byte differs):
    python3 bench/gpu/fused_fp8_quant.py
``bench/gpu/gpu_profile_scoring.py --eager-too`` scores an artifact both ways, for the whole pass.
"""

from __future__ import annotations

import sys
import time

import torch

from quantgate.numerics import native


def _time(fn, repeats: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / repeats


def main() -> None:
    if native._fused_kernel() is None:
        sys.exit("Triton is not installed here: quantize_per_token runs the eager operations")
    ok = True
    for k in (4096, 14336):  # an 8B layer's two input widths, a batch of 8 windows of 2,048 tokens
        x = torch.randn(16384, k, device="cuda", dtype=torch.bfloat16)
        (q, scale), (eq, escale) = native.quantize_per_token(x), native.quantize_per_token_eager(x)
        same = torch.equal(q.view(torch.uint8), eq.view(torch.uint8)) and torch.equal(scale, escale)
        ok = ok and same
        fused = _time(lambda x=x: native.quantize_per_token(x))
        eager = _time(lambda x=x: native.quantize_per_token_eager(x))
        print(
            f"[16384, {k}]: eager {eager * 1e3:.2f} ms, fused {fused * 1e3:.2f} ms ({eager / fused:.1f}x), "
            f"same bits {same}"
        )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
