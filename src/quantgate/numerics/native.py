"""Native FP8 GEMMs on Hopper (and Ada, Blackwell): ``hopper-fp8`` measured with the hardware's kernel.

On CPU an FP8 artifact is emulated (``emulated.py``: exactly decoded operands, float32
accumulation). Where CUDA with compute capability 8.9 or higher is present, the same
artifact can run on the tensor cores themselves: ``torch._scaled_mm`` with the FP8 weights as
stored, per-token FP8 activations quantized as vLLM's ``dynamic_per_token_scaled_fp8_quant``
does (scale = max(amax/448, 1/(448*512)), x * (1/scale), clamp, round to nearest even), a
per-channel weight scale and a per-token activation scale applied to the float32 accumulator
in the epilogue, and precise accumulation (``use_fast_accum=False``), which is what vLLM's
CUTLASS FP8 path does on Hopper. The result is then what the serving kernel computes, not a
model of it; ``load_for_eval`` labels it ``native``.

MoE experts (``moe.QuantizedExperts``) run on the same kernel, one GEMM per expert and
projection over the tokens routed to it: gate and up stored in bf16, SiLU-and-mul in float32,
the product quantized per token again, and the down GEMM's float32 accumulator scaled by the
token's routing weight before its bf16 store, which vLLM's Triton fused MoE (FP8 W8A8, per-token
activations, per-channel weights) computes in one kernel; the weight rides in the per-token
scale of the epilogue. A layer goes to the kernel whole or stays emulated whole.

What stays emulated, and is said so in the report: modules whose shapes the kernel refuses
(K or N not a multiple of 16), and the FP8 KV cache: its quantization is the same cast on the
GPU, but attention runs in bf16 over the dequantized values here, not in an FP8 attention kernel.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar, TypeGuard

import torch
from torch import Tensor, nn

from quantgate import sharding
from quantgate.numerics.emulated import EmulatedLinear
from quantgate.numerics.formats import FP8_E4M3FN_MAX
from quantgate.numerics.moe import QuantizedExperts

MIN_CAPABILITY = (8, 9)  # Ada: the first NVIDIA architecture with FP8 tensor cores
_NATIVE_PAIRS = {("fp8_e4m3fn", "fp8_e4m3fn_per_token")}  # (weights, activations) run natively


def native_fp8_device(device: str | torch.device) -> bool:
    """Whether ``device`` is a CUDA device with FP8 tensor cores (compute capability >= 8.9)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device) >= MIN_CAPABILITY


_MIN_SCALE = 1.0 / (FP8_E4M3FN_MAX * 512.0)


def quantize_per_token(x: Tensor) -> tuple[Tensor, Tensor]:
    """Dynamic per-token OCP FP8: (q [M, K] float8_e4m3fn, scale [M, 1] float32), as vLLM computes them.

    On CUDA, two fused Triton passes (``fp8_quant_cuda``: the eager path spent more of a scoring
    pass than the FP8 GEMMs themselves); elsewhere, and where Triton is missing, the eager
    operations. Both give the same bits.
    """
    kernel = _fused_kernel() if x.is_cuda else None
    if kernel is not None:
        return kernel.quantize_per_token(x, FP8_E4M3FN_MAX, _MIN_SCALE)
    return quantize_per_token_eager(x)


@functools.cache
def _fused_kernel():
    try:
        from quantgate.numerics import fp8_quant_cuda
    except ImportError:
        return None
    return fp8_quant_cuda


def quantize_per_token_eager(x: Tensor) -> tuple[Tensor, Tensor]:
    """``quantize_per_token`` in torch operations: the same float32 arithmetic as
    ``formats.fp8_per_token`` (the emulated path), so the two paths differ only in the GEMM, never
    in what is fed to it."""
    x = x.float()
    amax = x.abs().amax(dim=-1, keepdim=True)
    scale = (amax / FP8_E4M3FN_MAX).clamp(min=_MIN_SCALE)
    q = (x * scale.reciprocal()).clamp(-FP8_E4M3FN_MAX, FP8_E4M3FN_MAX).to(torch.float8_e4m3fn)
    return q, scale


class NativeFP8Linear(nn.Module):
    """An FP8 W8A8 Linear on ``torch._scaled_mm``: stored FP8 weights, per-token FP8 inputs."""

    native: ClassVar[bool] = True
    weight: Tensor
    weight_scale: Tensor
    bias: Tensor | None

    def __init__(self, weight: Tensor, weight_scale: Tensor, bias: Tensor | None = None) -> None:
        super().__init__()
        if weight.dtype != torch.float8_e4m3fn:
            raise ValueError(f"weight is {weight.dtype}, expected torch.float8_e4m3fn")
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight.contiguous())
        # the kernel takes the per-channel scale as a (1, N) float32 row
        self.register_buffer("weight_scale", weight_scale.float().reshape(1, self.out_features).contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().float())

    @classmethod
    def from_emulated(cls, module: EmulatedLinear) -> NativeFP8Linear:
        """The same operands as an emulated FP8 module: its decoded values are FP8 x scale exactly,
        so dividing by the scale gives the stored FP8 bytes back bit for bit."""
        scale = module.weight_scale.reshape(-1, 1)
        safe = torch.where(scale == 0, torch.ones_like(scale), scale)
        weight = (module.weight / safe).to(torch.float8_e4m3fn)
        return cls(weight, scale, module.bias)

    def _gemm(self, x: Tensor, row_weight: Tensor | None = None) -> Tensor:
        """``x`` [M, K] through the kernel, in bf16; ``row_weight`` [M, 1] joins the token scale in the
        epilogue (float32, before the bf16 store)."""
        q, scale = quantize_per_token(x)
        if row_weight is not None:
            scale = scale * row_weight.float()
        return torch._scaled_mm(
            q,
            self.weight.t(),  # column-major, as the kernel requires
            scale_a=scale,
            scale_b=self.weight_scale,
            out_dtype=torch.bfloat16,
            use_fast_accum=False,
        )

    @torch.no_grad()
    def weighted(self, x: Tensor, row_weight: Tensor) -> Tensor:
        """A MoE expert's down projection times each token's routing weight [M, 1], stored once in
        bf16: the weight is folded into the per-token scale the epilogue applies to the float32
        accumulator, where vLLM's fused MoE multiplies the scaled accumulator by it (the same three
        float32 factors, in another order). No bias: expert projections have none."""
        if self.bias is not None:
            raise ValueError("a weighted product with a bias is not what the fused MoE kernel computes")
        return self._gemm(x, row_weight).to(x.dtype)

    @torch.no_grad()
    def forward(self, x: Tensor) -> Tensor:
        """The layer's output in bf16 (the kernel's output type), returned in the input's dtype."""
        shape = x.shape
        y = self._gemm(x.reshape(-1, self.in_features))
        if self.bias is not None:
            y = (y.float() + self.bias).to(torch.bfloat16)
        return y.reshape(*shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        """Shape and kernel, for ``print(model)``."""
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel=torch._scaled_mm"


@dataclass(frozen=True)
class NativeResult:
    """What ran natively: how many FP8 linears and MoE layers moved to the kernel, how many stayed
    emulated, and why."""

    replaced: int  # FP8 W8A8 linears outside MoE experts
    kept_emulated: int  # FP8 W8A8 linears the kernel refuses
    other_emulated: (
        int  # quantized modules of other formats (a mixed-precision artifact), MoE layers left emulated
    )
    device_name: str
    capability: tuple[int, int]
    moe_layers: int = 0  # MoE layers whose every expert projection runs on the kernel

    @property
    def whole(self) -> bool:
        """Every quantized module runs natively: only then is the evaluation labelled ``native``."""
        return not self.kept_emulated and not self.other_emulated

    @property
    def note(self) -> str:
        """The report line that replaces the emulation-fidelity note."""
        major, minor = self.capability
        kept = (
            f"; {self.kept_emulated} left emulated (K or N not a multiple of 16)"
            if self.kept_emulated
            else ""
        )
        if self.other_emulated:
            kept += f"; {self.other_emulated} quantized modules of other formats emulated"
        experts = (
            f"; the experts of {self.moe_layers} MoE layers on the same kernel, one GEMM per expert and "
            "projection, each token's routing weight folded into its down GEMM's token scale"
            if self.moe_layers
            else ""
        )
        return (
            f"native: {self.replaced} FP8 linears on torch._scaled_mm ({self.device_name}, sm_{major}{minor}), "
            "per-token activation and per-channel weight scales in the epilogue, precise fp32 accumulation, "
            f"bf16 output, as vLLM's CUTLASS FP8 path{experts}{kept}"
        )


def _w8a8(module: nn.Module) -> TypeGuard[EmulatedLinear]:
    """An emulated FP8 W8A8 linear (per-channel weights, dynamic per-token activations)."""
    return (
        isinstance(module, EmulatedLinear)
        and (
            module.weight_format,
            module.activation.name if module.activation is not None else None,
        )
        in _NATIVE_PAIRS
    )


def _kernel_accepts(module: EmulatedLinear) -> bool:
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def _native_experts(experts: QuantizedExperts) -> bool:
    """Whether every projection of every expert can run on the kernel; a MoE layer runs natively
    whole or not at all, so that its label says what it computed."""
    return all(_w8a8(m) and _kernel_accepts(m) and m.bias is None for m in experts.linears())


def apply_native(model: nn.Module, device: str | torch.device) -> NativeResult | None:
    """Swap every emulated FP8 W8A8 Linear of ``model`` (on ``device``, or on the CPU until it is
    dispatched there) for the native kernel that ``device`` runs, and the expert projections of
    every MoE layer whose projections all are.

    None (nothing changed) where ``device`` has no FP8 tensor cores or the model has no module
    of a natively supported format: those stay emulated and are labelled so. A model of which only
    some modules run natively (a mixed-precision artifact) is labelled ``emulated``, its note counting both.
    """
    if not native_fp8_device(device):
        return None
    moe = [m for m in model.modules() if isinstance(m, QuantizedExperts)]
    inside_experts = {id(linear) for m in moe for linear in m.linears()}
    candidates = [(name, m) for name, m in model.named_modules() if _w8a8(m) and id(m) not in inside_experts]
    accepted = [(name, m) for name, m in candidates if _kernel_accepts(m)]
    native_moe = [m for m in moe if _native_experts(m)]
    if not accepted and not native_moe:
        return None
    for name, module in accepted:
        # placed where the emulated module is: on ``device``, or on the CPU for a model that is
        # dispatched afterwards, layer by layer (``offload``)
        sharding.replace(model, name, _native(module))
    for experts in native_moe:
        # each rank's slice as it is (``sharding._cut_experts`` cut the emulated ones): the layer's
        # forward, and the sum over ranks installed on it, stay
        for projections in (experts.gate, experts.up, experts.down):
            for index, linear in enumerate(projections):
                assert _w8a8(linear)  # _native_experts checked every projection
                projections[index] = _native(linear)
    others = sum(isinstance(m, EmulatedLinear) and id(m) not in inside_experts for m in model.modules()) - (
        len(candidates) - len(accepted)
    )
    others += len(moe) - len(native_moe)
    torch_device = torch.device(device)
    return NativeResult(
        replaced=len(accepted),
        kept_emulated=len(candidates) - len(accepted),
        other_emulated=others,
        device_name=torch.cuda.get_device_name(torch_device),
        capability=torch.cuda.get_device_capability(torch_device),
        moe_layers=len(native_moe),
    )


def _native(module: EmulatedLinear) -> NativeFP8Linear:
    return NativeFP8Linear.from_emulated(module).to(module.weight.device)
