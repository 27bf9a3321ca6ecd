"""Every format against an independent float64 reference, exactly.

The references (conftest) build each format's value set from its bit fields and round by
search, ties to even. The float32 arithmetic of dynamic scales (amax / max, its reciprocal,
NVFP4's global * amax / 6) is part of each format's definition, as in the serving kernels, so
the references repeat it; what they check independently is the value grid, the clamping, the
rounding, and the decoding of bits on disk.
"""

from __future__ import annotations

import pytest
import torch

from quantgate.numerics import activation_format, kv_cache_format, register_activation, weight_format
from quantgate.numerics import formats as formats_module
from quantgate.runtime.errors import InputError

pytestmark = pytest.mark.unit


def test_reference_grids_have_the_documented_ranges(ref):
    fn, fnuz, e2m1 = ref.e4m3fn[0], ref.e4m3fnuz[0], ref.e2m1[0]
    assert (len(fn), fn.max().item(), fn[1].item()) == (127, 448.0, 2.0**-9)
    assert (len(fnuz), fnuz.max().item(), fnuz[1].item()) == (128, 240.0, 2.0**-10)
    assert e2m1.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _midpoints(grid: torch.Tensor, below: float) -> torch.Tensor:
    mids = ((grid[1:] + grid[:-1]) / 2)[grid[1:] <= below]
    return mids.float()


def _rows(qmax: float, grid: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Rows of 64 covering wide magnitudes, outliers, zeros, -0.0, underflow, and exact ties."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randn(64, generator=g) * s for s in (1e-6, 1e-2, 1.0, 37.0, 3e4)]
    outlier = torch.randn(64, generator=g)
    outlier[5] = 900.0  # one large value: everything else lands in the subnormal range
    tiny = torch.randn(64, generator=g) * 1e-7
    tiny[0] = 1.0
    signed_zeros = torch.randn(64, generator=g)
    signed_zeros[:8] = torch.tensor([0.0, -0.0] * 4)
    # amax == qmax makes the scale exactly 1, so midpoints between grid values are exact ties
    mids = _midpoints(grid, qmax)
    ties = torch.cat([torch.tensor([qmax]), mids[-63:]])
    ties = torch.cat([ties, torch.zeros(64 - len(ties))])
    ties[1::2] *= -1
    return torch.stack([*rows, outlier, tiny, signed_zeros, torch.zeros(64), torch.full((64,), -0.0), ties])


@pytest.mark.parametrize(
    "name, grid_name, qmax",
    [("fp8_e4m3fn_per_token", "e4m3fn", 448.0), ("fp8_e4m3fnuz_per_token", "e4m3fnuz", 224.0)],
)
def test_fp8_per_token_matches_reference(name, grid_name, qmax, ref):
    grid = getattr(ref, grid_name)
    x = _rows(qmax, grid[0])
    out = activation_format(name).quantize(x, None)
    assert out.dtype == torch.float32
    assert torch.equal(out, ref.per_token(x, grid, qmax))
    assert torch.isfinite(out).all()
    # the largest value of a row comes back exactly (it maps to qmax), unless the scale floor
    # 1/(qmax*512) engaged for a row of tiny values
    unfloored = x.abs().amax(-1) / qmax > 1.0 / (qmax * 512.0)
    assert torch.equal(out.abs().amax(-1)[unfloored], x.abs().amax(-1)[unfloored])
    # bf16 inputs (what the model feeds) go the same way
    xb = x.bfloat16()
    assert torch.equal(activation_format(name).quantize(xb, None), ref.per_token(xb, grid, qmax))


def test_fnuz_activations_use_224_not_240(ref):
    # amax 224 gives a scale of exactly 1 (with 240 it would be 224/240 and 1.0 would come back
    # as 0.9917); 216 is a tie between 208 and 224 and goes to the even code, 224
    x = torch.tensor([[224.0, 216.0, 1.0, -0.0]])
    out = activation_format("fp8_e4m3fnuz_per_token").quantize(x, None)
    assert out.tolist() == [[224.0, 224.0, 1.0, 0.0]]


def test_nvfp4_activations_match_reference(ref):
    g = torch.Generator().manual_seed(1)
    calibrated_amax = 4.0
    global_scale = torch.tensor([448.0 * 6.0 / calibrated_amax])
    x = torch.randn(6, 128, generator=g)
    x[0, :16] = 0.0  # an empty group
    x[0, 16:32] = -0.0
    x[1, :16] *= 1e-9  # group scale underflows e4m3
    x[2, :16] *= 40.0  # beyond calibration: the group scale saturates at 448, values clamp at 6
    x[3, :] = (torch.arange(128) % 13 - 6) * 0.5  # many exact ties after scaling
    for inputs in (x, x.bfloat16()):
        out = activation_format("nvfp4_calibrated").quantize(inputs, global_scale)
        assert torch.equal(out, ref.nvfp4(inputs, global_scale))
    assert activation_format("nvfp4_calibrated").needs_global_scale


def _nvfp4_inputs(device: str = "cpu") -> torch.Tensor:
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(3)) * torch.logspace(-9, 4, 8)[:, None]
    x[0, :16] = 0.0  # a group whose scale is 0: the library's stand-in 0.125
    x[0, 16:32] = float("nan")
    x[1, :16] = -torch.rand(16)  # a group of negative values only
    return x.to(device)


def _library_nvfp4_scales(x: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES
    from compressed_tensors.quantization.utils import compute_dynamic_scales_and_zp

    args = PRESET_SCHEMES["NVFP4"]["input_activations"]
    scale, _ = compute_dynamic_scales_and_zp(value=x, args=args, module=None, global_scale=global_scale)
    return scale


def test_nvfp4_group_scales_are_compressed_tensors_own_bit_for_bit():
    # the group scales are computed here (the library's own builds a tensor on the host at every
    # call, which a CUDA graph cannot record); they must stay the library's, NaN and 0 included
    x = _nvfp4_inputs()
    for global_scale in (torch.tensor(448.0 * 6 / 4.0), torch.tensor(3.1e4), torch.tensor(0.37)):
        ours = formats_module.nvfp4_group_scales(x, global_scale)
        torch.testing.assert_close(
            ours, _library_nvfp4_scales(x, global_scale), rtol=0, atol=0, equal_nan=True
        )
        assert (ours == formats_module.NVFP4_ZERO_SCALE).any()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_nvfp4_activations_are_the_librarys_and_record_in_a_cuda_graph():
    # blackwell-nvfp4 decoding on Hopper ran eagerly: the library's scale computation copied from
    # the host inside the step, which "Cannot copy between CPU and CUDA tensors during CUDA graph capture"
    x, global_scale = _nvfp4_inputs("cuda"), torch.tensor(448.0 * 6 / 4.0, device="cuda")
    torch.testing.assert_close(
        formats_module.nvfp4_group_scales(x, global_scale), _library_nvfp4_scales(x, global_scale),
        rtol=0, atol=0, equal_nan=True,
    )  # fmt: skip
    fmt = activation_format("nvfp4_calibrated")
    eager = fmt.quantize(x, global_scale)  # also the warm-up: Triton compiles outside the graph
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        recorded = fmt.quantize(x, global_scale)
    graph.replay()
    torch.testing.assert_close(recorded, eager, rtol=0, atol=0, equal_nan=True)


def test_nvfp4_global_scale_changes_the_result():
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(2))
    fmt = activation_format("nvfp4_calibrated")
    assert not torch.equal(
        fmt.quantize(x, torch.tensor([448.0 * 6 / 3.0])), fmt.quantize(x, torch.tensor([40.0]))
    )


@pytest.mark.parametrize(
    "name, grid_name, qmax", [("fp8_e4m3fn", "e4m3fn", 448.0), ("fp8_e4m3fnuz", "e4m3fnuz", 240.0)]
)
def test_kv_cache_formats_match_reference(name, grid_name, qmax, ref):
    grid = getattr(ref, grid_name)
    x = _rows(qmax, grid[0], seed=3) * 0.01
    x[0, :4] = torch.tensor([500.0, -500.0, 250.0, -250.0])  # beyond range: saturate, never NaN
    for inputs in (x, x.bfloat16()):
        out = kv_cache_format(name).quantize(inputs)
        assert out.dtype == inputs.dtype
        expected = ref.round(inputs.double().clamp(-qmax, qmax), grid)
        assert torch.equal(out.double(), expected)
    assert kv_cache_format(name).quantize(torch.tensor([1000.0])).item() == qmax


# ---------------------------------------------------------------------------- weights


def _all_fp8_codes() -> torch.Tensor:
    codes = torch.tensor([c for c in range(256) if c not in (0x7F, 0xFF)] + [0, 0], dtype=torch.int64)
    return codes.reshape(4, 64)


def test_fp8_weights_decode_exactly_and_fnuz_doubles_scales(ref):
    codes = _all_fp8_codes()
    weight = codes.to(torch.uint8).view(torch.float8_e4m3fn)
    scale = (torch.rand(4, 1, generator=torch.Generator().manual_seed(4)) * 0.01).bfloat16()
    fn = weight_format("fp8_e4m3fn").decode({"weight": weight, "weight_scale": scale})
    expected = ref.decode(codes, 3, 7, 4) * scale.double()
    assert torch.equal(fn.values.double(), expected)  # exact in float32

    fnuz = weight_format("fp8_e4m3fnuz").decode({"weight": weight, "weight_scale": scale})
    fnuz_values = ref.decode(codes, 3, 8, 4)
    fnuz_values[codes == 0x80] = 0.0  # NaN in fnuz, zeroed as vLLM does
    assert torch.equal(fnuz.values.double(), fnuz_values * (2 * scale.double()))
    assert torch.equal(fnuz.scales, 2 * scale.float())
    # half the value, twice the scale: the weights CDNA3 multiplies are numerically Hopper's
    assert torch.equal(fnuz.values, fn.values)


def test_nvfp4_weights_decode_exactly(ref):
    g = torch.Generator().manual_seed(5)
    packed = torch.randint(0, 256, (4, 32), generator=g, dtype=torch.int64)
    scale = (torch.rand(4, 4, generator=g) * 2).to(torch.float8_e4m3fn)
    global_scale = torch.tensor([123.5])
    decoded = weight_format("nvfp4").decode(
        {"weight_packed": packed.to(torch.uint8), "weight_scale": scale, "weight_global_scale": global_scale}
    )
    nibbles = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(4, 64)  # low nibble first
    e2m1 = ref.decode(nibbles, 1, 1, 2)
    expected = e2m1 * scale.double().repeat_interleave(16, dim=1)
    assert torch.equal(decoded.values.double(), expected)
    assert decoded.global_scale.item() == 123.5  # applied after the matmul, not folded in


def test_int4_weights_decode_exactly():
    g = torch.Generator().manual_seed(6)
    q = torch.randint(-8, 8, (4, 128), generator=g, dtype=torch.int64)
    nibbles = (q + 8).reshape(4, 16, 8)  # offset binary, eight to a word, element k at bits 4k
    words = (nibbles << (4 * torch.arange(8))).sum(-1)
    packed = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    scale = (torch.rand(4, 2, generator=g) * 0.1).bfloat16()
    decoded = weight_format("int4").decode(
        {"weight_packed": packed, "weight_scale": scale, "weight_shape": torch.tensor([4, 128])}
    )
    assert torch.equal(decoded.values.double(), q.double() * scale.double().repeat_interleave(64, dim=1))


def _stored(name: str) -> dict[str, torch.Tensor]:
    """A small module's tensors as ``name`` stores them on disk."""
    g = torch.Generator().manual_seed(7)
    scale = (torch.rand(4, 1, generator=g) * 0.01).bfloat16()
    if name.startswith("fp8"):
        weight = torch.randint(0, 256, (4, 64), generator=g).to(torch.uint8).view(torch.float8_e4m3fn)
        return {"weight": weight, "weight_scale": scale}
    if name == "nvfp4":
        return {
            "weight_packed": torch.randint(0, 256, (4, 32), generator=g).to(torch.uint8),
            "weight_scale": (torch.rand(4, 4, generator=g) * 2).to(torch.float8_e4m3fn),
            "weight_global_scale": torch.tensor([123.5]),
        }
    words = torch.randint(-(2**31), 2**31 - 1, (4, 16), generator=g, dtype=torch.int64)
    return {"weight_packed": words.to(torch.int32), "weight_scale": scale.expand(4, 2).contiguous(),
            "weight_shape": torch.tensor([4, 128])}  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["fp8_e4m3fn", "fp8_e4m3fnuz", "nvfp4", "int4"])
def test_weights_decode_on_the_gpu_to_the_cpus_values(name):
    # an evaluation on a GPU reads an artifact's tensors onto the GPU and decodes them there; the
    # NVFP4 decode once indexed its CPU value table with the GPU's bytes and crashed every
    # blackwell-nvfp4 evaluation on the H200
    stored = _stored(name)
    on_cpu = weight_format(name).decode(stored).values
    on_gpu = weight_format(name).decode({k: v.to("cuda") for k, v in stored.items()}).values
    assert on_gpu.device.type == "cuda"
    # bit for bit; random FP8 bytes include e4m3fn's NaN codes (0x7f, 0xff), which torch.equal never
    # calls equal (the H200 run of 2026-12-03 failed on that, not on a value)
    torch.testing.assert_close(on_gpu.cpu(), on_cpu, rtol=0, atol=0, equal_nan=True)


# ---------------------------------------------------------------------------- registry


def test_unknown_format_names_the_known_ones():
    with pytest.raises(InputError) as info:
        activation_format("fp8_e5m2_per_token")
    assert "fp8_e4m3fn_per_token" in str(info.value) and "register_activation" in str(info.value)
    with pytest.raises(InputError):
        weight_format("int3")


def test_a_new_format_is_one_function_and_a_decorator():
    try:

        @register_activation("test_identity", expects={})
        def identity(x, global_scale=None):
            return x.float()

        assert activation_format("test_identity").quantize(torch.ones(2), None).tolist() == [1.0, 1.0]
        with pytest.raises(ValueError, match="already registered"):
            register_activation("test_identity", expects={})(identity)
    finally:
        formats_module.ACTIVATION_FORMATS._entries.pop("test_identity", None)
