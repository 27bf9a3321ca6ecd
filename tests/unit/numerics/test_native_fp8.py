"""Native FP8 (torch._scaled_mm) against the emulated path: same operands, labelled honestly.

The module tests run on CPU too (torch's CPU ``_scaled_mm`` takes the same row-wise scales), so
the operand recovery and the per-token quantization are checked in CI; the end-to-end tests are
marked ``gpu`` and run only where CUDA with FP8 tensor cores exists.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from quantgate.calibration import build_set, load_spec
from quantgate.config.gates import load_gates
from quantgate.intake import intake
from quantgate.numerics import EmulatedLinear, load_for_eval
from quantgate.numerics import native as native_module
from quantgate.numerics.formats import activation_format, fp8_e4m3fn_per_token
from quantgate.numerics.moe import expert_bounds, route
from quantgate.numerics.native import (
    NativeFP8Experts,
    NativeFP8Linear,
    apply_native,
    native_fp8_device,
    quantize_per_token,
)
from quantgate.numerics.weights import weight_format
from support.builds import build_targets

pytestmark = pytest.mark.unit

IDS = torch.randint(3, 512, (2, 24), generator=torch.Generator().manual_seed(0))


def _kernel_device() -> str | None:
    """Where torch's _scaled_mm takes row-wise scales: an FP8 GPU, or the CPU of torch >= 2.13 (torch
    2.11's CPU kernel takes per-tensor scales only); None where neither does."""
    if native_fp8_device("cuda"):
        return "cuda"
    a = torch.ones(2, 16).to(torch.float8_e4m3fn)
    try:
        torch._scaled_mm(
            a, a.t(), scale_a=torch.ones(2, 1), scale_b=torch.ones(1, 2), out_dtype=torch.bfloat16
        )
    except RuntimeError:
        return None
    return "cpu"


KERNEL = _kernel_device()
needs_rowwise_kernel = pytest.mark.skipif(KERNEL is None, reason="no _scaled_mm with row-wise scales here")
needs_fp8_gpu = pytest.mark.skipif(
    not native_fp8_device("cuda"), reason="needs CUDA with FP8 tensor cores (compute capability >= 8.9)"
)


def _emulated_fp8(out_features: int = 48, in_features: int = 64, seed: int = 0) -> EmulatedLinear:
    g = torch.Generator().manual_seed(seed)
    weight = (torch.randn(out_features, in_features, generator=g) * 100).clamp(-448, 448)
    tensors = {
        "weight": weight.to(torch.float8_e4m3fn),
        "weight_scale": torch.rand(out_features, 1, generator=g) * 1e-3 + 1e-5,
    }
    return EmulatedLinear(
        weight_format("fp8_e4m3fn").decode(tensors),
        activation_format("fp8_e4m3fn_per_token"),
        weight_format="fp8_e4m3fn",
    )


def test_native_module_holds_the_stored_fp8_bytes_exactly():
    emulated = _emulated_fp8()
    native = NativeFP8Linear.from_emulated(emulated)
    assert native.weight.dtype == torch.float8_e4m3fn
    back = native.weight.float() * native.weight_scale.reshape(-1, 1)
    assert torch.equal(back, emulated.weight)  # bit for bit the operand the emulation multiplies


def test_per_token_quantization_is_the_emulated_one():
    x = torch.randn(7, 64, dtype=torch.bfloat16) * torch.logspace(-3, 2, 7).reshape(7, 1)
    x[3] = 0  # an all-zero row takes the floor scale, not a division by zero
    q, scale = quantize_per_token(x)
    assert torch.equal(q.float() * scale, fp8_e4m3fn_per_token(x))


@pytest.mark.gpu
@needs_fp8_gpu
@pytest.mark.parametrize("k", [64, 4096, 14336 + 7])  # one block of the kernel, several, a ragged tail
def test_gpu_fused_quantization_gives_the_eager_bits(k):
    """The fused Triton quantization (on CUDA) against the eager torch operations, bit for bit, on
    rows of every magnitude, an all-zero row (the floor scale) and a row holding a NaN."""
    g = torch.Generator().manual_seed(k)
    x = torch.randn(257, k, generator=g) * torch.logspace(-8, 4, 257).reshape(257, 1)
    x[5] = 0
    x[9, k // 2] = float("nan")
    x = x.to(torch.bfloat16).to("cuda")
    assert native_module._fused_kernel() is not None  # the GPU image has Triton: the fused path is taken
    q, scale = quantize_per_token(x)
    eager_q, eager_scale = native_module.quantize_per_token_eager(x)
    assert torch.equal(q.view(torch.uint8), eager_q.view(torch.uint8))
    assert torch.equal(scale.nan_to_num(-1.0), eager_scale.nan_to_num(-1.0))


@needs_rowwise_kernel
def test_native_module_matches_emulation_up_to_its_bf16_output():
    emulated = _emulated_fp8().to(KERNEL)
    native = NativeFP8Linear.from_emulated(emulated)
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16, device=KERNEL)
    reference = emulated.matmul(x)  # float32: exactly decoded operands, fp32 accumulation
    out = native(x)
    assert out.shape == (3, 5, 48) and out.dtype == torch.bfloat16
    relative = (out.float() - reference).norm() / reference.norm()
    assert relative < 4e-3  # bf16 output rounding (2^-9 relative per element), nothing more


def test_on_cpu_nothing_is_native(tmp_path):
    model = torch.nn.Sequential(_emulated_fp8())
    assert apply_native(model, "cpu") is None
    assert isinstance(model[0], EmulatedLinear)


def test_only_a_wholly_native_model_is_labelled_native(monkeypatch):
    _mock_fp8_gpu(monkeypatch)
    fp8 = _emulated_fp8()
    w8a16 = EmulatedLinear(
        weight_format("fp8_e4m3fn").decode(
            {"weight": fp8.weight.to(torch.float8_e4m3fn), "weight_scale": torch.ones(48, 1)}
        ),
        None,
        weight_format="fp8_e4m3fn",
    )  # weight-only: no FP8 activations, so no FP8 GEMM to run natively
    mixed = torch.nn.Sequential(_emulated_fp8(seed=1), w8a16)
    result = apply_native(mixed, "cpu")
    assert result is not None and result.replaced == 1 and result.other_emulated == 1 and not result.whole
    assert isinstance(mixed[0], NativeFP8Linear) and isinstance(mixed[1], EmulatedLinear)
    assert "1 quantized modules of other formats emulated" in result.note

    whole = torch.nn.Sequential(torch.nn.Sequential(_emulated_fp8(seed=2)), _emulated_fp8(48, 48, seed=3))
    result = apply_native(whole, "cpu")
    assert result is not None and result.whole and result.replaced == 2
    assert result.note.startswith("native: 2 FP8 linears on torch._scaled_mm (test GPU, sm_90)")
    if KERNEL == "cpu":  # the swapped model runs where the kernel takes row-wise scales
        assert whole(torch.randn(2, 64, dtype=torch.bfloat16)).shape == (2, 48)


@pytest.fixture(scope="module")
def hopper_artifact(tiny_source, tmp_path_factory, repo_root, catalog) -> Path:
    record = intake(tiny_source, load_gates(repo_root / "gates.yaml", catalog))
    out = tmp_path_factory.mktemp("native-artifacts")
    calibration = build_set(load_spec(repo_root / "calibration_sets" / "default.yaml"))
    (result,) = build_targets(record, ["hopper-fp8"], out, catalog, calibration)
    return result.path


def test_cpu_evaluation_is_labelled_emulated(hopper_artifact):
    numerics = load_for_eval(hopper_artifact).numerics
    assert numerics.mode == "emulated"
    assert not any(note.startswith("native:") for note in numerics.notes)


@pytest.mark.gpu
@needs_fp8_gpu
def test_gpu_evaluation_runs_the_fp8_kernel_and_says_so(hopper_artifact):
    loaded = load_for_eval(hopper_artifact, device="cuda")
    assert loaded.numerics.mode == "native"
    assert loaded.numerics.notes[0].startswith("native:") and "_scaled_mm" in loaded.numerics.notes[0]
    assert any(isinstance(m, NativeFP8Linear) for m in loaded.model.modules())
    assert not any(isinstance(m, EmulatedLinear) for m in loaded.model.modules())
    assert loaded.numerics.kv_cache_layers > 0 and "stays emulated" in loaded.numerics.notes[3]


@pytest.mark.gpu
@needs_fp8_gpu
def test_gpu_native_logits_agree_with_emulation_on_the_same_artifact(hopper_artifact):
    ids = IDS.to("cuda")
    with torch.no_grad():
        native = load_for_eval(hopper_artifact, device="cuda").model(ids).logits.float()
        emulated_model = load_for_eval(hopper_artifact, device="cuda", native=False)
        assert emulated_model.numerics.mode == "emulated"
        emulated = emulated_model.model(ids).logits.float()
    relative = (native - emulated).norm() / emulated.norm()
    assert 0 < relative < 2e-2  # the kernel is really used (not identical) and computes the same function


def _bytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))


@pytest.mark.gpu
@needs_fp8_gpu
def test_gpu_offloaded_layers_give_the_resident_logits_bit_for_bit(hopper_artifact, tiny_source):
    """``--max-memory`` on a GPU worker (issue 29): the last layer kept in host memory and copied to
    the GPU for its forward runs the same native kernels on the same bytes; source and artifact."""
    from quantgate.numerics import load_source_for_eval

    ids = IDS.to("cuda")
    for load in (lambda **kw: load_for_eval(hopper_artifact, device="cuda", **kw),
                 lambda **kw: load_source_for_eval(tiny_source, device="cuda", **kw)):  # fmt: skip
        resident = load()
        layers = resident.model.model.layers
        budget = _bytes(resident.model) - _bytes(layers[-1])  # everything but the last layer fits
        with torch.no_grad():
            expected = resident.model(ids).logits
        del resident
        offloaded = load(max_memory=budget)
        assert offloaded.numerics.offloaded_layers == 1
        assert "host memory" in " ".join(offloaded.numerics.notes)
        last = offloaded.model.model.layers[-1]
        assert {t.device.type for t in (*last.parameters(), *last.buffers())} == {"meta"}  # held off the GPU
        with torch.no_grad():
            assert torch.equal(offloaded.model(ids).logits, expected)


def _fp8_experts(intermediate: int = 32, hidden: int = 64, n: int = 4):
    from quantgate.numerics.moe import ExpertWeights, QuantizedExperts

    def expert(seed: int) -> ExpertWeights:
        gate, up, down = (
            _emulated_fp8(intermediate, hidden, seed),
            _emulated_fp8(intermediate, hidden, seed + 1),
            _emulated_fp8(hidden, intermediate, seed + 2),
        )
        return ExpertWeights(*(_decoded(m) for m in (gate, up, down)))

    return QuantizedExperts(
        [expert(10 * e) for e in range(n)],
        activation_format("fp8_e4m3fn_per_token"),
        torch.nn.functional.silu,
        weight_format="fp8_e4m3fn",
    )


def _routing(hidden: int = 64):
    g = torch.Generator().manual_seed(5)
    states = torch.randn(6, hidden, generator=g).to(torch.bfloat16)
    index = torch.tensor([[0, 1], [2, 3], [1, 2], [3, 0], [0, 2], [1, 3]])
    weights = torch.softmax(torch.randn(6, 2, generator=g), dim=-1)
    return states, index, weights


def _mock_fp8_gpu(monkeypatch) -> None:
    # CPU stands in for an FP8 GPU here (torch's CPU _scaled_mm takes the same arguments)
    monkeypatch.setattr(native_module, "native_fp8_device", lambda device: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "test GPU")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))


def test_moe_experts_go_to_the_kernel_with_the_linears_device_check_mocked(monkeypatch):
    """A MoE artifact on an FP8 GPU: its attention linears and every expert projection go to the
    kernel, and the evaluation is labelled native. (The 30B-A3B shape on the H200 once crashed
    here, when expert linears were swapped without a weighted down product; then it kept every
    expert emulated in float32 and scored at a tenth of lm-eval's speed.)"""
    _mock_fp8_gpu(monkeypatch)
    experts = _fp8_experts()
    layer = torch.nn.ModuleDict({"attn": _emulated_fp8(64, 64, seed=99), "experts": experts})
    states, index, weights = _routing()
    emulated = experts(states, index, weights)

    result = apply_native(layer, "cpu")
    assert result is not None and result.whole and result.replaced == 1 and result.moe_layers == 1
    assert "the experts of 1 MoE layers on the same kernel, one grouped GEMM per projection" in result.note
    assert isinstance(layer["attn"], NativeFP8Linear)
    stacked = layer["experts"]
    assert isinstance(stacked, NativeFP8Experts) and stacked.native
    assert stacked.gate_up_weight.dtype == torch.float8_e4m3fn and stacked.gate_up_weight.shape == (4, 64, 64)
    assert "kernel=torch._scaled_mm" in repr(stacked)
    if KERNEL == "cpu":
        native = stacked(states, index, weights)
        assert native.dtype == torch.bfloat16 and native.shape == emulated.shape
        relative = (native.float() - emulated.float()).norm() / emulated.float().norm()
        assert relative < 8e-3  # gate, up and down each stored in bf16 once, in another order


def test_a_moe_layer_the_kernel_refuses_stays_emulated_whole_device_check_mocked(monkeypatch):
    _mock_fp8_gpu(monkeypatch)
    experts = _fp8_experts(intermediate=40)  # 40 intermediate features: not a multiple of 16
    layer = torch.nn.ModuleDict({"attn": _emulated_fp8(64, 64, seed=99), "experts": experts})
    states, index, weights = _routing()
    before = experts(states, index, weights)

    result = apply_native(layer, "cpu")
    assert result is not None and result.replaced == 1 and result.moe_layers == 0 and not result.whole
    assert result.other_emulated == 1  # the MoE layer, counted once, labelled emulated
    assert all(isinstance(m, EmulatedLinear) for m in experts.linears()) and not experts.native
    torch.testing.assert_close(experts(states, index, weights), before, rtol=0, atol=0)


@pytest.mark.gpu
@needs_fp8_gpu
def test_gpu_moe_experts_on_the_kernel_agree_with_their_emulation(monkeypatch):
    """On the GPU the experts run as one grouped GEMM per projection (Hopper): the same products
    as the emulation within the bf16 stores, and as one ``_scaled_mm`` per expert within an ulp."""
    experts = _fp8_experts(intermediate=64, hidden=128, n=8).to("cuda")
    g = torch.Generator().manual_seed(3)
    states = torch.randn(64, 128, generator=g).to(torch.bfloat16).to("cuda")
    index = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(64)]).to("cuda")
    index[0, 1] = 8  # transformers' sentinel: routed to no expert
    weights = torch.softmax(torch.randn(64, 2, generator=g), dim=-1).to("cuda")
    emulated = experts(states, index, weights).float()
    layer = torch.nn.ModuleDict({"experts": experts})
    result = apply_native(layer, "cuda")
    stacked = layer["experts"]
    assert result is not None and result.moe_layers == 1 and result.whole and stacked.native
    native = stacked(states, index, weights).float()
    relative = (native - emulated).norm() / emulated.norm()
    assert 0 < relative < 8e-3  # the kernel is really used, and stores gate, up and down in bf16 once each
    if torch.cuda.get_device_capability() == (9, 0):
        monkeypatch.setattr(native_module, "_grouped_kernel", lambda device, groups: False)
        looped = stacked(states, index, weights).float()
        assert (native - looped).norm() / looped.norm() < 1e-3


def test_the_grouped_gemm_takes_the_stacked_experts_as_laid_out():
    """The grouped kernel's contract (torch's own shape, stride and dtype checks, on the meta
    device): row-major FP8 rows with one scale each, every expert's [N, K] weight column-major."""
    q = torch.empty(10, 64, dtype=torch.float8_e4m3fn, device="meta")
    weight = torch.empty(3, 96, 64, dtype=torch.float8_e4m3fn, device="meta")
    ends = torch.empty(3, dtype=torch.int32, device="meta")
    out = native_module.grouped_gemm(
        q, torch.empty(10, 1, device="meta"), weight, torch.empty(3, 96, device="meta"), ends
    )
    assert out.shape == (10, 96) and out.dtype == torch.bfloat16


def test_routes_keep_each_experts_rows_in_token_order_and_drop_the_sentinel():
    index = torch.tensor([[2, 0], [0, 4], [2, 1]])  # 4: no expert of 3
    weights = torch.tensor([[0.6, 0.4], [0.7, 0.3], [0.5, 0.5]])
    routes = route(index, weights, 3)
    assert routes.ends.tolist() == [2, 3, 5] and routes.ends.dtype == torch.int32
    assert routes.token.tolist() == [0, 1, 2, 0, 2, 1]  # expert 0: tokens 0, 1; 1: 2; 2: 0, 2; then none
    assert routes.weight.squeeze(-1).tolist() == pytest.approx([0.4, 0.7, 0.5, 0.6, 0.5, 0.3])
    assert expert_bounds(routes) == [(0, 0, 2), (1, 2, 3), (2, 3, 5)]


def _decoded(module: EmulatedLinear):
    from quantgate.numerics.weights import DecodedWeight

    return DecodedWeight(values=module.weight, scales=module.weight_scale.reshape(-1, 1))
