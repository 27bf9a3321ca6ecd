"""The devices a build test runs on: the CPU always, a CUDA GPU where there is one (``gpu``-marked,
run on the lent device machine and listed in BENCHMARKS.md; CI has no GPU)."""

from __future__ import annotations

import pytest
import torch

CPU_AND_CUDA = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")],
    ),
]
