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
from quantgate.runtime.errors import ServingError
from support.builds import build_targets
from support.models import tiny_config, write_tiny_model, write_tiny_tokenizer

TARGETS = ("hopper-fp8", "rocm-cdna3-fp8", "blackwell-nvfp4", "draft-int4")
# the MoE layouts of transformers 5.17 and the targets each builds (moe_artifacts)
MOE_KINDS = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")
MOE_TARGETS = ("hopper-fp8", "rocm-cdna3-fp8", "blackwell-nvfp4")


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


def tiny_moe_config(kind: str):
    """A tiny config of each MoE layout: Mixtral (block_sparse_moe, w1/w2/w3 on disk), Qwen2-MoE
    (shared expert and its sigmoid gate), Qwen3-MoE (normalized top-k, no shared expert) and
    DeepSeek-V3 (a dense first layer, a shared expert, grouped top-k routing with a score
    correction bias, multi-head latent attention). Sizes are multiples of 16 for NVFP4."""
    from transformers import DeepseekV3Config, Qwen3MoeConfig

    common = {
        "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": 256, "tie_word_embeddings": False, "bos_token_id": 1,
        "eos_token_id": 2, "pad_token_id": 0,
    }  # fmt: skip
    if kind == "qwen3_moe":
        return Qwen3MoeConfig(
            **common, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
            norm_topk_prob=True,
        )  # fmt: skip
    if kind == "deepseek_v3":
        return DeepseekV3Config(
            **common, num_key_value_heads=4, moe_intermediate_size=64, n_routed_experts=8, n_shared_experts=1,
            num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1, q_lora_rank=64,
            kv_lora_rank=64, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16, num_mtp_layers=0,
        )  # fmt: skip
    return tiny_config(kind)


def write_tiny_moe(directory: Path, kind: str, seed: int = 0) -> Path:
    """A tiny random MoE checkpoint of ``kind`` (bf16, saved by transformers) with a tokenizer."""
    from transformers import AutoModelForCausalLM

    directory.mkdir(parents=True)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(tiny_moe_config(kind), dtype=torch.bfloat16).save_pretrained(directory)
    write_tiny_tokenizer(directory)
    return directory


@pytest.fixture(scope="package")
def moe_calibration(repo_root):
    return build_set(load_spec(repo_root / "calibration_sets" / "default.yaml"))


@pytest.fixture(scope="package")
def moe_artifacts(tmp_path_factory, repo_root, catalog, moe_calibration) -> dict[str, SimpleNamespace]:
    """``{kind: (source, record, {target: artifact dir}, refused)}`` for every MoE layout, FP8 and NVFP4.
    ``refused``: the build's serving check refused the layout (its message), no artifacts."""
    gates = load_gates(repo_root / "gates.yaml", catalog)
    built = {}
    for kind in MOE_KINDS:
        base = tmp_path_factory.mktemp(f"moe-{kind}")
        source = write_tiny_moe(base / "source", kind)
        record = intake(source, gates)
        try:
            results = build_targets(record, list(MOE_TARGETS), base / "artifacts", catalog, moe_calibration)
        except (
            ServingError
        ) as exc:  # the build's serving check refused it: this kind's tests xfail, saying so
            built[kind] = SimpleNamespace(source=source, record=record, artifacts={}, refused=str(exc))
            continue
        artifacts = {r.target: r.path for r in results}
        built[kind] = SimpleNamespace(source=source, record=record, artifacts=artifacts, refused=None)
    return built


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


def decode_minifloat(codes: torch.Tensor, mantissa_bits: int, bias: int, exponent_bits: int) -> torch.Tensor:
    """float64 values of minifloat bit patterns (int64 codes) from their sign, exponent and mantissa."""
    sign = (codes >> (exponent_bits + mantissa_bits)) & 1
    e = (codes >> mantissa_bits) & ((1 << exponent_bits) - 1)
    m = (codes & ((1 << mantissa_bits) - 1)).double() / (1 << mantissa_bits)
    value = torch.where(e == 0, m * 2.0 ** (1 - bias), (1 + m) * torch.pow(2.0, e.double() - bias))
    return torch.where(sign == 1, -value, value)


def per_token(x: torch.Tensor, grid, qmax: float) -> torch.Tensor:
    """Dynamic per-token FP8: the scale's float32 arithmetic as the kernels define it, then the grid."""
    x32 = x.float()
    scale = (x32.abs().amax(-1, keepdim=True) / qmax).clamp(min=1.0 / (qmax * 512.0))
    scaled = x32 * scale.reciprocal()
    return (round_to_grid(scaled.double().clamp(-qmax, qmax), grid) * scale.double()).float()


def nvfp4(x: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """NVFP4 activations: E4M3 group scales of 16 values under a global scale, E2M1 values."""
    groups = x.float().unflatten(-1, (-1, 16))
    gs = global_scale.float()
    s = gs * (groups.abs().amax(-1, keepdim=True) / 6.0)
    s8 = round_to_grid(s.double().clamp(-448.0, 448.0), E4M3FN).float()
    s8 = torch.where(s8 == 0, torch.tensor(0.125), s8)  # compressed-tensors' guard for empty groups
    eff = s8 / gs
    q = round_to_grid((groups / eff).double().clamp(-6.0, 6.0), E2M1)
    return (q * eff.double()).float().flatten(-2)


@pytest.fixture(scope="session")
def ref() -> SimpleNamespace:
    """The float64 references, as a fixture (test modules here are not importable packages)."""
    return SimpleNamespace(
        e4m3fn=E4M3FN,
        e4m3fnuz=E4M3FNUZ,
        e2m1=E2M1,
        round=round_to_grid,
        decode=decode_minifloat,
        per_token=per_token,
        nvfp4=nvfp4,
    )
