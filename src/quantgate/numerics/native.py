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

A MoE layer's experts run on the same arithmetic as ``NativeFP8Experts``: stacked, the
routed rows sorted by expert on the device, and one grouped FP8 GEMM per projection
(``torch._scaled_grouped_mm`` on Hopper, CUTLASS with the same row-wise epilogue and precise
accumulation; one ``_scaled_mm`` per expert elsewhere): gate and up stored in bf16, SiLU-and-mul
in float32, the product quantized per token again, and the down GEMM's float32 accumulator scaled
by the token's routing weight before its bf16 store, which vLLM's Triton fused MoE (FP8 W8A8,
per-token activations, per-channel weights) computes in one kernel; the weight rides in the
per-token scale of the epilogue. A layer goes to the kernel whole or stays emulated whole.

A load converts each decoder layer as soon as it is decoded (``to_kernel``), so the float32
decode of a whole model, 4 bytes a parameter, never exists; ``apply_native`` converts what is
left in an installed model and says what runs natively.

What stays emulated, and is said so in the report: modules whose shapes the kernel refuses
(K or N not a multiple of 16), and the FP8 KV cache: its quantization is the same cast on the
GPU, but attention runs in bf16 over the dequantized values here, not in an FP8 attention kernel.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, TypeGuard

import torch
from torch import Tensor, nn

from quantgate.numerics.emulated import EmulatedLinear
from quantgate.numerics.formats import FP8_E4M3FN_MAX, activation_format
from quantgate.numerics.moe import QuantizedExperts, RoutedExperts, Routes, expert_bounds
from quantgate.runtime import sharding

MIN_CAPABILITY = (8, 9)  # Ada: the first NVIDIA architecture with FP8 tensor cores
_NATIVE_PAIRS = {("fp8_e4m3fn", "fp8_e4m3fn_per_token")}  # (weights, activations) run natively


def native_fp8_device(device: str | torch.device) -> bool:
    """Whether ``device`` is a CUDA device with FP8 tensor cores (compute capability >= 8.9)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device) >= MIN_CAPABILITY


_MIN_SCALE = 1.0 / (FP8_E4M3FN_MAX * 512.0)


def per_token_scale(amax: Tensor) -> Tensor:
    """A row's FP8 scale from its absmax [M, 1] float32, vLLM's ``max(amax / 448, 1 / (448 * 512))``:
    the one formula both quantization paths use."""
    return (amax / FP8_E4M3FN_MAX).clamp(min=_MIN_SCALE)


def quantize_per_token(x: Tensor) -> tuple[Tensor, Tensor]:
    """Dynamic per-token OCP FP8: (q [M, K] float8_e4m3fn, scale [M, 1] float32), as vLLM computes them.

    On CUDA, two fused Triton passes (``fp8_quant_cuda``: the eager path spent more of a scoring
    pass than the FP8 GEMMs themselves); elsewhere, and where Triton is missing, the eager
    operations. Both give the same bits.
    """
    kernel = _fused_kernel() if x.is_cuda else None
    if kernel is not None:
        return kernel.quantize_per_token(x, FP8_E4M3FN_MAX, per_token_scale)
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
    scale = per_token_scale(x.abs().amax(dim=-1, keepdim=True))
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
        weight = (module.decoded_weight() / safe).to(torch.float8_e4m3fn)
        return cls(weight, scale, module.bias)

    @torch.no_grad()
    def forward(self, x: Tensor) -> Tensor:
        """The layer's output in bf16 (the kernel's output type), returned in the input's dtype."""
        shape = x.shape
        y = _scaled_gemm(*quantize_per_token(x.reshape(-1, self.in_features)), self.weight, self.weight_scale)
        if self.bias is not None:
            y = (y.float() + self.bias).to(torch.bfloat16)
        return y.reshape(*shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        """Shape and kernel, for ``print(model)``."""
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel=torch._scaled_mm"


def _scaled_gemm(q: Tensor, scale: Tensor, weight: Tensor, weight_scale: Tensor) -> Tensor:
    """``q`` [M, K] FP8 with row scales [M, 1] times ``weight`` [N, K] FP8 with channel scales [1, N],
    in bf16: scales applied to the float32 accumulator in the epilogue, precise accumulation."""
    return torch._scaled_mm(
        q,
        weight.t(),  # column-major, as the kernel requires
        scale_a=scale,
        scale_b=weight_scale,
        out_dtype=torch.bfloat16,
        use_fast_accum=False,
    )


class NativeFP8Experts(RoutedExperts):
    """A MoE layer's FP8 W8A8 experts on the kernel: each projection's experts stacked ([E, N, K]
    FP8 weights, [E, N] channel scales; gate and up as one [E, 2I, H] GEMM, as vLLM's w13), so that
    a layer costs one grouped GEMM per projection where a loop over 128 experts cost 3 x 128 small
    GEMMs and a host sync per expert (the 30B-A3B shape scored at 0.14x lm-eval's speed so)."""

    native: ClassVar[bool] = True
    gate_up_weight: Tensor
    gate_up_scale: Tensor
    down_weight: Tensor
    down_scale: Tensor

    def __init__(
        self,
        gate_up: tuple[Tensor, Tensor],
        down: tuple[Tensor, Tensor],
        act_fn: Callable[[Tensor], Tensor],
        *,
        notes: tuple[str, ...] = (),
    ) -> None:
        super().__init__(
            down[0].shape[0],
            act_fn,
            activation=activation_format("fp8_e4m3fn_per_token"),
            weight_format="fp8_e4m3fn",
            notes=notes,
        )
        self.register_buffer("gate_up_weight", gate_up[0].contiguous())
        self.register_buffer("gate_up_scale", gate_up[1].float().contiguous())
        self.register_buffer("down_weight", down[0].contiguous())
        self.register_buffer("down_scale", down[1].float().contiguous())

    @property
    def intermediate(self) -> int:
        """Each expert's intermediate features: half of the stacked gate/up rows."""
        return self.gate_up_weight.shape[1] // 2

    @classmethod
    def from_emulated(cls, experts: QuantizedExperts) -> NativeFP8Experts:
        """The stored FP8 operands of every expert (``NativeFP8Linear.from_emulated``), stacked; the
        slice a rank holds stays that slice (``sharding`` cut the emulated experts)."""

        def stacked(*projections: nn.ModuleList) -> tuple[Tensor, Tensor]:
            weights, scales = [], []
            for linears in zip(*projections, strict=True):
                native = [_native(linear) for linear in linears]
                weights.append(torch.cat([m.weight for m in native]))
                scales.append(torch.cat([m.weight_scale[0] for m in native]))
            return torch.stack(weights), torch.stack(scales)

        module = cls(
            stacked(experts.gate, experts.up), stacked(experts.down), experts.act_fn, notes=experts.notes
        )
        if sharding.is_cut(experts):
            sharding.mark_cut(module)
        return module

    def routed(self, hidden_states: Tensor, routes: Routes) -> Tensor:
        """Gate/up and down over the sorted rows; each token quantized once (its scale does not
        depend on the expert), the routing weight folded into the down GEMM's row scales."""
        q, scale = quantize_per_token(hidden_states)
        gate_up = self._gemm(
            q[routes.token], scale[routes.token], self.gate_up_weight, self.gate_up_scale, routes
        )
        gate, up = gate_up.split(self.intermediate, dim=-1)
        gated = (self.act_fn(gate.float()) * up.float()).to(hidden_states.dtype)
        q, scale = quantize_per_token(gated)
        down = self._gemm(q, scale * routes.weight.float(), self.down_weight, self.down_scale, routes)
        return down.to(hidden_states.dtype)

    def _gemm(self, q: Tensor, scale: Tensor, weight: Tensor, weight_scale: Tensor, routes: Routes) -> Tensor:
        """One grouped GEMM where torch has it for this GPU; else one ``_scaled_mm`` per expert."""
        if _grouped_kernel(q.device, self.num_experts):
            return grouped_gemm(q, scale, weight, weight_scale, routes.ends)
        out = q.new_zeros((q.shape[0], weight.shape[1]), dtype=torch.bfloat16)
        for index, start, end in expert_bounds(routes):
            # a copy of the rows' scales: cuBLASLt refuses a scale vector that starts off 16 bytes
            # (CUBLAS_STATUS_NOT_SUPPORTED on the H200 at row 18)
            out[start:end] = _scaled_gemm(
                q[start:end], scale[start:end].clone(), weight[index], weight_scale[index : index + 1].clone()
            )
        return out


def grouped_gemm(q: Tensor, scale: Tensor, weight: Tensor, weight_scale: Tensor, ends: Tensor) -> Tensor:
    """Rows ``ends[e-1]:ends[e]`` of ``q`` [M, K] (row scales [M, 1]) times expert ``e``'s ``weight``
    [E, N, K] (channel scales [E, N]), in bf16 [M, N]; rows past ``ends[-1]`` are left unwritten."""
    return torch._scaled_grouped_mm(
        q,
        weight.transpose(-2, -1),  # column-major per expert, as the kernel requires
        scale.reshape(-1).contiguous(),
        weight_scale,
        offs=ends,
        out_dtype=torch.bfloat16,
        use_fast_accum=False,
    )


_GROUPED_MAX = 1023  # torch's CUTLASS grouped kernel: "Can't process more than 1024 groups"


def _grouped_kernel(device: torch.device, groups: int) -> bool:
    """torch's grouped FP8 GEMM with row-wise scales: built for Hopper (sm_90) in torch 2.8 and later."""
    return device.type == "cuda" and groups <= _GROUPED_MAX and _hopper(device.index)


@functools.cache
def _hopper(index: int | None) -> bool:
    return hasattr(torch, "_scaled_grouped_mm") and torch.cuda.get_device_capability(index) == (9, 0)


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
            f"; the experts of {self.moe_layers} MoE layers on the same kernel, one grouped GEMM per "
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


def to_kernel(modules: dict[str, nn.Module], device: str | torch.device) -> dict[str, nn.Module]:
    """``modules`` (built, not yet installed: ``numerics.artifact.emulated_modules``) with each one
    ``device``'s kernel runs in its kernel's form: an FP8 W8A8 linear it accepts as a
    ``NativeFP8Linear``, a MoE layer whose every projection it accepts as ``NativeFP8Experts``; the
    others as they are. A load converts layer by layer, so that the float32 decode of the whole
    model (4 bytes a parameter: a 70B is twice an H200) never exists at once."""
    if not native_fp8_device(device):
        return modules
    return {name: _kernel_form(module) for name, module in modules.items()}


def _kernel_form(module: nn.Module) -> nn.Module:
    if isinstance(module, QuantizedExperts):
        return NativeFP8Experts.from_emulated(module) if _native_experts(module) else module
    if _w8a8(module) and _kernel_accepts(module):
        return _native(module)
    return module


def apply_native(model: nn.Module, device: str | torch.device) -> NativeResult | None:
    """Swap every emulated FP8 W8A8 Linear of ``model`` (on ``device``, or on the CPU until it is
    dispatched there) that the native kernel of ``device`` accepts for that kernel, and every MoE
    layer whose projections all are (modules ``to_kernel`` converted before they were installed
    stay); then say what runs natively.

    None where ``device`` has no FP8 tensor cores or no module runs natively: the model is
    emulated and labelled so. A model of which only some modules run natively (a mixed-precision
    artifact) is labelled ``emulated``, its note counting both.
    """
    if not native_fp8_device(device):
        return None
    for name, module in _emulated(model):
        converted = _kernel_form(module)
        if converted is not module:
            # placed where the emulated module is: on ``device``, or on the CPU for a model that
            # is dispatched afterwards (``offload``); each rank's slice as it is, and
            # ``replace`` installs an experts module's sum over ranks
            sharding.replace(model, name, converted)
    experts = [m for m in model.modules() if isinstance(m, RoutedExperts)]
    linears = [m for _, m in _emulated(model) if isinstance(m, EmulatedLinear)]
    replaced = sum(isinstance(m, NativeFP8Linear) for m in model.modules())
    native_moe = sum(m.native for m in experts)
    if not replaced and not native_moe:
        return None
    refused = sum(_w8a8(m) for m in linears)  # W8A8 linears the kernel does not accept
    torch_device = torch.device(device)
    return NativeResult(
        replaced=replaced,
        kept_emulated=refused,
        other_emulated=len(linears) - refused + len(experts) - native_moe,
        device_name=torch.cuda.get_device_name(torch_device),
        capability=torch.cuda.get_device_capability(torch_device),
        moe_layers=native_moe,
    )


def _emulated(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The emulated linears and MoE layers of ``model``, by name; an emulated MoE layer's own
    expert linears are its, not listed apart."""
    inside = {
        id(linear) for m in model.modules() if isinstance(m, QuantizedExperts) for linear in m.linears()
    }
    return [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, QuantizedExperts | EmulatedLinear) and id(m) not in inside
    ]


def _native(module: EmulatedLinear) -> NativeFP8Linear:
    native = NativeFP8Linear.from_emulated(module).to(module.weight_scale.device)
    if sharding.is_cut(module):  # read as this rank's slice: ``replace`` must not cut it again
        sharding.mark_cut(native)
    return native
