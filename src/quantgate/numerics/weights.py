"""Weight formats: how a quantized Linear's tensors on disk decode into the values a kernel uses.

Each decoder takes the module's raw tensors as read from the artifact's safetensors (local
names: ``weight``, ``weight_scale``, ``weight_packed``, ...) and returns the grid values times
their local scales in float32. That product is exact in float32 for every format here (an FP8
or E2M1 value has at most 4 significant bits, a bf16 or E4M3 scale at most 8), so nothing is
lost to a bf16 rounding of ``w * scale`` that no kernel performs. A per-tensor global scale
(NVFP4) is kept apart and applied after the matmul, where the kernel applies it.

A new format is one function plus ``@register_weights(name, disk_format=..., required=...)``, in
a module of this package or, from outside, in a module that an installed distribution names under
the ``quantgate.weight_formats`` entry point (``WEIGHT_FORMATS``).
Unpacking follows compressed-tensors' own layout (its helpers and value tables), so the bit
layout is the writer's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import torch
from torch import Tensor

from quantgate.runtime.extensions import PluginRegistry


@dataclass(frozen=True)
class DecodedWeight:
    """``values``: (out, in) float32, grid value x local scale (exact); ``global_scale``:
    divide the matmul's output by it (None: no global scale); ``scales``: the local scales
    as float32, kept for inspection and tests."""

    values: Tensor
    scales: Tensor
    global_scale: Tensor | None = None


@dataclass(frozen=True)
class WeightFormat:
    """How one on-disk weight format decodes: its tensors, its config.json name, its decoder."""

    name: str
    disk_format: str  # compressed-tensors format name in config.json
    required: frozenset[str]  # local tensor names the decoder needs
    optional: frozenset[str]  # names it accepts besides (activation scales it passes on)
    decode: Callable[[dict[str, Tensor]], DecodedWeight]
    note: str


class WeightDecodeError(ValueError):
    """The tensors of one module do not fit its declared format (load.py names the file)."""


WEIGHT_FORMATS: PluginRegistry[WeightFormat] = PluginRegistry(
    "weight format",
    "quantgate.weight_formats",
    __name__.rpartition(".")[0],
    "register_weights",
    f"{__name__}:WeightFormat",
)


def register_weights(
    name: str,
    *,
    disk_format: str,
    required: AbstractSet[str],
    optional: AbstractSet[str] = frozenset(),
    note: str = "",
):
    """Decorator: register a decoder ``tensors -> DecodedWeight`` as weight format ``name``."""

    def decorator(fn: Callable[[dict[str, Tensor]], DecodedWeight]):
        WEIGHT_FORMATS.add(
            name, WeightFormat(name, disk_format, frozenset(required), frozenset(optional), fn, note)
        )
        return fn

    return decorator


def weight_format(name: str) -> WeightFormat:
    """The registered weight format ``name`` (an unknown name suggests the nearest)."""
    return WEIGHT_FORMATS.get(name, "quantgate.numerics")


def weight_formats() -> list[str]:
    """Names of the registered weight formats."""
    return WEIGHT_FORMATS.names()


def _broadcast_scale(scale: Tensor, out_features: int) -> Tensor:
    """Per-channel (out, 1) or per-tensor (1,) scales as float32 (out, 1); others refused."""
    scale = scale.float()
    if scale.numel() == 1:
        return scale.reshape(1, 1).expand(out_features, 1).clone()
    if scale.shape in ((out_features, 1), (out_features,)):
        return scale.reshape(out_features, 1)
    raise WeightDecodeError(
        f"weight_scale of shape {tuple(scale.shape)} is neither per-channel ({out_features}, 1) nor per-tensor"
    )


def _expand_groups(scale: Tensor, in_features: int, g_idx: Tensor | None = None) -> Tensor:
    """Group scales (out, in/g) repeated along the input dimension: (out, in)."""
    groups = scale.shape[-1]
    if g_idx is not None:
        return scale[:, g_idx.long()]
    if in_features % groups:
        raise WeightDecodeError(f"{groups} scale groups do not divide {in_features} input features")
    return scale.repeat_interleave(in_features // groups, dim=-1)


@register_weights(
    "fp8_e4m3fn",
    disk_format="float-quantized",
    required={"weight", "weight_scale"},
    note="weights: OCP e4m3fn with per-channel scales, decoded exactly",
)
def fp8_e4m3fn(tensors: dict[str, Tensor]) -> DecodedWeight:
    """OCP FP8 weights times their per-channel (or per-tensor) scales."""
    weight = tensors["weight"]
    if weight.dtype != torch.float8_e4m3fn:
        raise WeightDecodeError(f"weight is {weight.dtype}, expected torch.float8_e4m3fn")
    scale = _broadcast_scale(tensors["weight_scale"], weight.shape[0])
    return DecodedWeight(values=weight.float() * scale, scales=scale)


@register_weights(
    "fp8_e4m3fnuz",
    disk_format="float-quantized",
    required={"weight", "weight_scale"},
    note=(
        "weights: the OCP bits reinterpreted as e4m3fnuz, 0x80 (NaN in fnuz) set to 0, scales doubled, "
        "as vLLM's normalize_e4m3fn_to_e4m3fnuz does on MI300"
    ),
)
def fp8_e4m3fnuz(tensors: dict[str, Tensor]) -> DecodedWeight:
    """Same bytes as fp8_e4m3fn; a fnuz value is half the fn value with the same bits, hence x2."""
    weight = tensors["weight"]
    if weight.dtype != torch.float8_e4m3fn:
        raise WeightDecodeError(f"weight is {weight.dtype}, expected torch.float8_e4m3fn on disk")
    bits = weight.view(torch.uint8).clone()
    bits[bits == 0x80] = 0  # negative zero in fn, NaN in fnuz
    scale = _broadcast_scale(tensors["weight_scale"], weight.shape[0]) * 2.0
    return DecodedWeight(values=bits.view(torch.float8_e4m3fnuz).float() * scale, scales=scale)


@register_weights(
    "nvfp4",
    disk_format="nvfp4-pack-quantized",
    required={"weight_packed", "weight_scale", "weight_global_scale"},
    optional={"input_global_scale"},
    note="weights: packed E2M1 x E4M3 scale per 16 values, divided by weight_global_scale after the matmul",
)
def nvfp4(tensors: dict[str, Tensor]) -> DecodedWeight:
    """Packed E2M1 values times their E4M3 group scales; the global scale kept apart."""
    packed, scale = tensors["weight_packed"], tensors["weight_scale"]
    if packed.dtype != torch.uint8 or scale.dtype != torch.float8_e4m3fn:
        raise WeightDecodeError(
            f"weight_packed {packed.dtype} / weight_scale {scale.dtype}: expected uint8 / e4m3fn"
        )
    out_features, in_features = packed.shape[0], packed.shape[1] * 2
    values = _e2m1_byte_table().to(packed.device)[packed.long()].reshape(out_features, in_features)
    scale = scale.float()
    global_scale = tensors["weight_global_scale"].float().reshape(())
    if not (torch.isfinite(global_scale) and global_scale > 0):
        raise WeightDecodeError(f"weight_global_scale is {global_scale.item()}, expected finite and positive")
    return DecodedWeight(
        values=values * _expand_groups(scale, in_features), scales=scale, global_scale=global_scale
    )


@functools.cache
def _e2m1_byte_table() -> Tensor:
    """(256, 2) float32: the two E2M1 values of each byte, low nibble first.

    compressed-tensors' ``unpack_fp4_from_uint8`` decodes the same layout (its value table is
    used here) but took ~90 ms per module on 2 cores, ~19 s for the 135M default model; one
    gather through a byte table does the same in a few ms.
    """
    from compressed_tensors.compressors.nvfp4.helpers import kE2M1ToFloat

    nibbles = torch.arange(16)
    values = kE2M1ToFloat.float()[nibbles & 0x7] * torch.where(nibbles & 0x8 > 0, -1.0, 1.0)
    byte = torch.arange(256)
    return torch.stack([values[byte & 0xF], values[byte >> 4]], dim=-1)


@register_weights(
    "int4",
    disk_format="pack-quantized",
    required={"weight_packed", "weight_scale", "weight_shape"},
    optional={"weight_g_idx"},
    note="weights: symmetric INT4 packed eight to an int32, per-group scales",
)
def int4(tensors: dict[str, Tensor]) -> DecodedWeight:
    """Signed INT4 values unpacked from int32 words, times their group scales."""
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    packed = tensors["weight_packed"]
    if packed.dtype != torch.int32:
        raise WeightDecodeError(f"weight_packed is {packed.dtype}, expected torch.int32")
    shape = torch.Size(int(v) for v in tensors["weight_shape"].tolist())
    values = unpack_from_int32(packed, 4, shape).float()  # signed, in [-8, 7]
    scale = tensors["weight_scale"].float()
    if scale.ndim != 2 or scale.shape[0] != shape[0]:
        raise WeightDecodeError(
            f"weight_scale of shape {tuple(scale.shape)} does not fit a weight of {tuple(shape)}"
        )
    g_idx = tensors.get("weight_g_idx")
    return DecodedWeight(values=values * _expand_groups(scale, shape[1], g_idx), scales=scale)
