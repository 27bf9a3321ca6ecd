"""Which W4A16 (WNA16) kernel vLLM picks for a layer shard on the fleet's hardware, if any.

vLLM tries its mixed-precision kernels in order and takes the first whose ``can_implement``
accepts the shard (``model_executor/kernels/linear/__init__.py``: ``choose_mp_linear_kernel``,
``_POSSIBLE_KERNELS``); a layer fails to load only when every kernel refuses. Modeled: the
kernels of vLLM's own wheel that run on the fleet's GPUs with 16-bit activations (Machete,
Marlin, Exllama, Triton W4A16), each function citing its file. Left out: CUTLASS W4A8 (FP8
activations), AllSpark (Ampere only; gone by 0.33.0), the RDNA kernels (gfx11/12, not CDNA3),
Conch and Humming (packages vLLM does not install: an image that adds them loads more, never less).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from quantgate.declarations.serving_releases import version_key


@dataclass(frozen=True)
class Platform:
    """A GPU family as vLLM's kernel selection sees it."""

    name: str
    vendor: str  # "cuda" | "rocm"
    capability: int | None  # CUDA compute capability (90 = Hopper), None on ROCm


PLATFORMS = {
    "nvidia-hopper": Platform("nvidia-hopper", "cuda", 90),
    "nvidia-blackwell": Platform("nvidia-blackwell", "cuda", 100),
    "amd-cdna3": Platform("amd-cdna3", "rocm", None),
}


@dataclass(frozen=True)
class Shard:
    """``MPLinearLayerConfig``: one TP shard of a WNA16 layer."""

    k_full: int
    k: int  # input features per shard
    n: int  # output features per shard
    bits: int
    group: int  # -1: per channel
    zero_points: bool
    act_dtype: str  # "bfloat16" | "float16" | ...

    @property
    def quant_type(self) -> str:
        """vLLM's scalar type name: uint4b8 (symmetric 4-bit, bias 8), uint4 (with zero points)..."""
        return f"uint{self.bits}" if self.zero_points else f"uint{self.bits}b{2 ** (self.bits - 1)}"


Check = Callable[[Shard, Platform, str], "str | None"]  # None: can implement; else why not


def machete(c: Shard, p: Platform, version: str) -> str | None:
    """``MacheteLinearKernel.can_implement`` (``mixed_precision/machete.py``, ``utils/machete_utils.py``)."""
    if p.vendor != "cuda" or p.capability != 90:
        return "Machete requires compute capability 90 (Hopper)"
    types = ("uint4", "uint8") if c.zero_points else ("uint4b8", "uint8b128")
    if c.quant_type not in types:
        return f"Machete does not support {c.quant_type}"
    groups = (-1, 64, 128) if c.act_dtype in ("float16", "bfloat16") else (-1, 128)
    if c.group not in groups:
        return f"Machete does not support group size {c.group} (supported: {list(groups)})"
    if c.k % 64:
        return f"Machete needs input features per shard % 64, got {c.k}"
    if c.n % 128:
        return f"Machete needs output features per shard % 128, got {c.n}"
    return None


def marlin(c: Shard, p: Platform, version: str) -> str | None:
    """``MarlinLinearKernel.can_implement`` (``mixed_precision/marlin.py``, ``utils/marlin_utils.py``).

    From 0.24.0 a misaligned N or K is zero-padded to a thread tile (``marlin_padded_nk``) and
    only a group straddling a TP shard is refused; 0.23.0 refuses N per shard % 64 or K per
    shard % 128 (``verify_marlin_supports_shape``).
    """
    if p.vendor != "cuda":
        return "Marlin only supported on CUDA"
    types = ("uint4",) if c.zero_points else ("uint4b8", "uint8b128")
    if c.quant_type not in types:
        return f"Marlin does not support {c.quant_type}"
    if c.group not in (-1, 32, 64, 128):
        return f"Marlin does not support group size {c.group} (supported: [-1, 32, 64, 128])"
    if version_key(version) < (0, 24, 0):
        if c.n % 64:
            return f"Marlin needs output features per shard % 64 (min_thread_n), got {c.n}"
        if c.k % 128:
            return f"Marlin needs input features per shard % 128 (min_thread_k), got {c.k}"
    if c.group != -1 and c.group < c.k_full and c.k % c.group:
        return f"Marlin: input features per shard {c.k} not divisible by group size {c.group}"
    return None


def exllama(c: Shard, p: Platform, version: str) -> str | None:
    """``ExllamaLinearKernel.can_implement`` (``mixed_precision/exllama.py``): float16 activations only."""
    if c.n % (32 // c.bits):
        return "Exllama needs output features a multiple of the pack factor"
    if c.act_dtype != "float16":
        return f"Exllama only supports float16 activations, the model runs {c.act_dtype}"
    if c.quant_type not in ("uint4b8", "uint8b128"):
        return f"Exllama does not support {c.quant_type}"
    if c.group <= 0:
        return "Exllama does not support channelwise quantization"
    if c.k_full % c.group:
        return f"Exllama: group size {c.group} does not divide input features {c.k_full}"
    return None


def triton_w4a16(c: Shard, p: Platform, version: str) -> str | None:
    """``TritonW4A16LinearKernel.can_implement`` (``mixed_precision/triton_w4a16.py``): 4-bit only."""
    if c.quant_type not in ("uint4b8", "uint4"):
        return f"Triton W4A16 does not support {c.quant_type}"
    if c.act_dtype not in ("float16", "bfloat16"):
        return "Triton W4A16 only supports float16/bfloat16 activations"
    if c.n % 8:
        return f"Triton W4A16 needs output features per shard % 8, got {c.n}"
    if c.group not in (-1, 32, 64, 128, 256) and c.group != c.k_full:
        return f"Triton W4A16 does not support group size {c.group}"
    group = c.group if c.group != -1 else c.k
    if c.k % group:
        return f"Triton W4A16: input features per shard {c.k} not divisible by group size {group}"
    return None


def chain(platform: Platform) -> list[tuple[str, Check]]:
    """The kernels vLLM tries on ``platform``, in its order (``_POSSIBLE_KERNELS``, 0.23.0 to 0.33.0)."""
    if platform.vendor == "rocm":
        return [("triton-w4a16", triton_w4a16), ("exllama", exllama)]
    return [("machete", machete), ("marlin", marlin), ("exllama", exllama), ("triton-w4a16", triton_w4a16)]


def choose(c: Shard, platform: Platform, version: str) -> tuple[str | None, list[str]]:
    """(the kernel vLLM picks, or None; every refusal on the way), as ``choose_mp_linear_kernel``."""
    reasons: list[str] = []
    for name, check in chain(platform):
        why = check(c, platform, version)
        if why is None:
            return name, reasons
        reasons.append(why)
    return None, reasons
