"""Where build, eval, repair and run compute: ``--device auto|cuda|cpu`` resolved once, at the edge.

``auto`` (the default) is CUDA when torch sees a GPU, else the CPU, so a GPU worker uses its GPU
without being told and CI (no GPU) keeps its CPU path. ``cuda`` on a machine without one is a
usage error (exit 2), not a silent fall back: an operator who asked for the GPU gets it or a
refusal. The library functions take the resolved name ("cpu" or "cuda") and record it (run.json's
``device``, the manifest's ``build.device``, every result's numerics).
"""

from __future__ import annotations

from typing import Literal

from quantgate.runtime.errors import InputError

CHOICES = ("auto", "cuda", "cpu")
Device = Literal["cpu", "cuda"]


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (False where torch has no CUDA build)."""
    import torch

    return bool(torch.cuda.is_available())


def resolve(requested: str | None) -> Device:
    """``auto`` (or None) -> "cuda" when available, else "cpu"; "cuda" without a GPU is InputError."""
    name = (requested or "auto").strip().lower()
    if name not in CHOICES:
        raise InputError("--device", f"{requested!r} is not a device", f"pass one of {', '.join(CHOICES)}")
    if name == "auto":
        return "cuda" if cuda_available() else "cpu"
    if name == "cuda" and not cuda_available():
        raise InputError(
            "--device", "cuda was asked for but torch sees no CUDA device", "pass --device cpu or auto"
        )
    return "cuda" if name == "cuda" else "cpu"
