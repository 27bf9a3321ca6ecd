"""Tiny artifacts of every target, built once for the numerics tests, and float64 references.

The references enumerate every representable value of a format from its bit fields (sign,
exponent, mantissa, bias) in float64 and round to nearest, ties to even, by search: nothing
in them uses torch's float8 casts or compressed-tensors, which the code under test relies on.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from quantgate.calibration import build_set, load_spec
from quantgate.config.gates import load_gates
from quantgate.intake import intake
from quantgate.quantize.pipeline import build_targets
from quantgate.synthetic import write_tiny_model

TARGETS = ("hopper-fp8", "rocm-cdna3-fp8", "blackwell-nvfp4", "draft-int4")


@pytest.fixture(scope="package")
def tiny_source(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("numerics-src") / "tiny-llama", "llama")


@pytest.fixture(scope="package")
def artifacts(tiny_source, tmp_path_factory, repo_root, catalog) -> dict[str, Path]:
    """``{target: artifact dir}``; read-only for tests (copy before damaging one)."""
    record = intake(tiny_source, load_gates(repo_root / "gates.yaml", catalog))
    calibration = build_set(load_spec(repo_root / "calibration_sets" / "default.yaml"))
    out = tmp_path_factory.mktemp("numerics-artifacts")
    return {r.target: r.path for r in build_targets(record, list(TARGETS), out, catalog, calibration)}


# ---------------------------------------------------------------------------- references


def _grid(
    exponent_bits: int, mantissa_bits: int, bias: int, codes: range
) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-negative values of a minifloat and their codes' mantissa parity, sorted by value."""
    values, parity = [], []
    for code in codes:
        e, m = code >> mantissa_bits, code & ((1 << mantissa_bits) - 1)
        if e == 0:
            v = (m / (1 << mantissa_bits)) * 2.0 ** (1 - bias)
        else:
            v = (1 + m / (1 << mantissa_bits)) * 2.0 ** (e - bias)
        values.append(v)
        parity.append(code & 1)
    order = sorted(range(len(values)), key=values.__getitem__)
    return (
        torch.tensor([values[i] for i in order], dtype=torch.float64),
        torch.tensor([parity[i] for i in order]),
    )


# e4m3fn: bias 7, S.1111.111 is NaN, so the largest code is 0x7E = 448
E4M3FN = _grid(4, 3, 7, range(0x7F))
# e4m3fnuz: bias 8, no negative zero, no infinities; 0x7F = 240
E4M3FNUZ = _grid(4, 3, 8, range(0x80))
# e2m1: bias 1: 0, 0.5, 1, 1.5, 2, 3, 4, 6
E2M1 = _grid(2, 1, 1, range(8))


def round_to_grid(x: torch.Tensor, grid: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Round float64 ``x`` (already clamped into range) to the nearest grid value, ties to even."""
    values, parity = grid
    x = x.double()
    mag = x.abs().clamp(max=values[-1].item())
    hi = torch.searchsorted(values, mag).clamp(max=len(values) - 1)
    lo = (hi - 1).clamp(min=0)
    d_lo, d_hi = mag - values[lo], values[hi] - mag
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (parity[hi] == 0))
    rounded = torch.where(pick_hi, values[hi], values[lo])
    return torch.where(x < 0, -rounded, rounded)


@pytest.fixture(scope="session")
def ref() -> SimpleNamespace:
    """The float64 references, as a fixture (test modules here are not importable packages)."""
    return SimpleNamespace(e4m3fn=E4M3FN, e4m3fnuz=E4M3FNUZ, e2m1=E2M1, round=round_to_grid)
