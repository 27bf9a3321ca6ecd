"""Which compressed-tensors scheme vLLM picks for each layer, and the tensors that scheme loads.

Reproduces vLLM 0.33.0's ``compressed_tensors/compressed_tensors.py`` for the schemes
quantgate's targets produce: config groups to schemes (``groups_of``, ``classify``), layers to
groups (``scheme_of``), and each scheme's ``create_weights`` (``expected_params``): the
parameters the checkpoint must supply, with their dtypes and shapes. The args are parsed with
compressed-tensors' own ``QuantizationArgs``, as vLLM does.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from quantgate.serving.layout import Layer

ACT_FORMATS = ("naive-quantized", "int-quantized", "float-quantized", "nvfp4-pack-quantized")
WNA16_BITS = (2, 3, 4, 5, 6, 7, 8)
FLOATS = ("F32", "BF16", "F16")  # scales are copied into the layer's dtype: any float loads


@dataclass(frozen=True)
class Scheme:
    """The scheme vLLM would build for a layer: its kind and the args it was built from."""

    kind: str  # "fp8" (W8A8 or W8A16 FP8), "nvfp4" (W4A4 or W4A16 NVFP4), "wna16"
    group: str  # the config group it came from
    weights: Any  # compressed_tensors QuantizationArgs
    inputs: Any | None
    format: str

    @property
    def group_size(self) -> int:
        """The weight group size along K; -1 for per-channel or per-tensor."""
        return self.weights.group_size or -1


@dataclass(frozen=True)
class Unsupported:
    """A config group vLLM (or quantgate's reproduction of it) has no scheme for."""

    group: str
    reason: str
    rule: str = "scheme"  # the rule that reports it ("actorder" for a refused activation ordering)


@dataclass(frozen=True)
class Group:
    """A config group as vLLM keeps it: targets and the scheme (or why there is none)."""

    name: str
    targets: tuple[str, ...]
    scheme: Scheme | Unsupported


def _args(value: Any):
    from compressed_tensors.quantization import QuantizationArgs

    return QuantizationArgs.model_validate(value) if value else None


def _strategy(args) -> str:
    return str(getattr(args.strategy, "value", args.strategy))


def _type(args) -> str:
    return str(getattr(args.type, "value", args.type))


def _is_nvfp4(args) -> bool:
    """compressed_tensors.py ``_is_nvfp4_format``: tensor_group, float, 4 bits, group 16, symmetric."""
    return (
        args is not None
        and _strategy(args) == "tensor_group"
        and _type(args) == "float"
        and args.num_bits == 4
        and args.group_size == 16
        and bool(args.symmetric)
    )


def _is_fp8_w8a8(w, a) -> bool:
    """compressed_tensors.py ``_is_fp8_w8a8``."""
    if w is None or a is None:
        return False
    if not (
        _type(w) == "float"
        and _type(a) == "float"
        and w.symmetric
        and not w.dynamic
        and _strategy(w) in ("tensor", "channel", "block")
    ):
        return False
    return bool(a.dynamic) or (bool(a.symmetric) and _strategy(a) == "tensor")


def _is_fp8_w8a16(w) -> bool:
    """compressed_tensors.py ``_is_fp8_w8a16``."""
    return (
        w is not None
        and _type(w) == "float"
        and bool(w.symmetric)
        and not w.dynamic
        and _strategy(w) in ("tensor", "channel", "block")
    )


def classify(group: str, weights, inputs, fmt: str | None) -> Scheme | Unsupported:
    """``_get_scheme_from_parts`` for the schemes modeled here; anything else is Unsupported."""
    if fmt is None:
        return Unsupported(
            group, "the quantization_config names no 'format' (vLLM reads it to pick the scheme)"
        )
    if _is_nvfp4(weights):
        if inputs is not None and not _is_nvfp4(inputs):
            return Unsupported(group, "NVFP4 weights need NVFP4 input activations, or none for NVFP4A16")
        return Scheme("nvfp4", group, weights, inputs, fmt)
    is_wna16 = _strategy(weights) in ("channel", "group") and inputs is None and not weights.dynamic
    if is_wna16 and fmt == "pack-quantized":
        if weights.num_bits not in WNA16_BITS:
            return Unsupported(
                group, f"{weights.num_bits}-bit weights: WNA16 supports {list(WNA16_BITS)} bits"
            )
        if (weights.group_size or -1) == -1 and _strategy(weights) != "channel":
            return Unsupported(
                group,
                "pack-quantized needs group or channel quantization (no group size, strategy not channel)",
            )
        return Scheme("wna16", group, weights, inputs, fmt)
    if fmt in ACT_FORMATS:
        if _strategy(weights) == "block":
            return Unsupported(
                group, "FP8 block-wise weights: quantgate does not reproduce vLLM's block-FP8 rules"
            )
        if _is_fp8_w8a8(weights, inputs) or _is_fp8_w8a16(weights):
            return Scheme("fp8", group, weights, inputs, fmt)
    if is_wna16:
        return Unsupported(
            group,
            f"weight-only {_type(weights)} weights in format '{fmt}': vLLM's WNA16 scheme "
            "needs format pack-quantized, and no other scheme takes them",
        )
    return Unsupported(
        group,
        f"no scheme quantgate reproduces matches weights {_type(weights)} "
        f"{weights.num_bits}-bit {_strategy(weights)}, inputs "
        f"{'none' if inputs is None else _type(inputs) + ' ' + _strategy(inputs)}, format '{fmt}'",
    )


def groups_of(quant: dict[str, Any]) -> list[Group]:
    """``from_config`` and ``_quantization_scheme_map_from_config``: config groups in order,
    attention-only groups dropped."""
    fmt = quant.get("format")
    out = []
    for name, group in (quant.get("config_groups") or {}).items():
        targets = tuple(group.get("targets") or ())
        if len(targets) == 1 and targets[0].endswith("Attention"):
            continue  # vLLM: attention quantization is coupled with the KV cache scheme, not a linear scheme
        group_fmt = group.get("format") or fmt
        order = (group.get("weights") or {}).get("actorder")
        if order in ("group", "dynamic"):  # refused before the args are parsed (compressed-tensors 0.19 too)
            out.append(Group(name, targets, Unsupported(name, f"actorder={order!r}", rule="actorder")))
            continue
        try:
            weights, inputs = _args(group.get("weights")), _args(group.get("input_activations"))
        except ValueError as exc:  # pydantic's ValidationError: vLLM's model_validate raises the same
            problem = exc.errors()[0]["msg"] if hasattr(exc, "errors") else str(exc)
            out.append(
                Group(name, targets, Unsupported(name, f"compressed-tensors refuses its args ({problem})"))
            )
            continue
        scheme = (
            classify(name, weights, inputs, group_fmt)
            if weights is not None
            else Unsupported(name, "the config group has no weights args")
        )
        out.append(Group(name, targets, scheme))
    return out


def matches(value: str, target: str, contains: bool = False) -> bool:
    """``is_equal_or_regex_match``: equal, ``re:`` regex matched at the start, or (class names) contained."""
    if target.startswith("re:"):
        return re.match(target[3:], value) is not None
    if contains:
        return target.lower() in value.lower()
    return target == value


def ignored(layer: Layer, ignore: list[str]) -> bool:
    """``should_ignore_layer`` for one shard: its name matches an ignore entry."""
    return any(matches(layer.name, pattern) for pattern in ignore)


def class_name(layer: Layer) -> str:
    """The vLLM module class a layer becomes; targets like ``Linear`` match it by containment."""
    return {"lm_head": "ParallelLMHead", "router": "ReplicatedLinear"}.get(
        layer.role, "RoutedExperts" if layer.parallel == "experts" else "LinearBase"
    )


def scheme_of(layer: Layer, groups: list[Group], ignore: list[str]) -> Group | None:
    """``get_scheme_dict``: None when ignored or no target matches, else the matched group.

    The ignore list first, then the first group whose target is the layer's name or a ``re:``
    regex matching it, then the first whose target is contained in the layer's vLLM class
    name. MoE layers target ``Linear`` too (``_add_fused_moe_to_target_scheme_map``).
    """
    if ignored(layer, ignore):
        return None
    for group in groups:  # a name or regex target first, as _find_first_match on the layer name
        if any(matches(layer.name, t) for t in group.targets):
            return group
    cls = class_name(layer)
    for group in groups:
        targets = [*group.targets, *(["RoutedExperts"] if "Linear" in group.targets else [])]
        if any(not t.startswith("re:") and matches(cls, t, contains=True) for t in targets):
            return group
    return None


@dataclass(frozen=True)
class Param:
    """A parameter a scheme loads: its checkpoint dtype(s) and shape."""

    dtypes: tuple[str, ...]
    shape: tuple[int, ...] | None  # None: any shape with ``numel`` elements
    numel: int | None = None


def expected_params(scheme: Scheme | None, n: int, k: int) -> dict[str, Param]:
    """The parameters a layer of logical shape [n, k] must carry under ``scheme`` (None: unquantized)."""
    if scheme is None:
        return {"weight": Param(FLOATS, (n, k))}
    w, a = scheme.weights, scheme.inputs
    if scheme.kind == "fp8":  # schemes/compressed_tensors_w8a8_fp8.py create_weights
        strategy = _strategy(w)
        params = {
            "weight": Param(("F8_E4M3",), (n, k)),
            "weight_scale": Param(FLOATS, (n, 1)) if strategy == "channel" else Param(FLOATS, None, 1),
        }
        if a is not None and not a.dynamic:
            params["input_scale"] = Param(FLOATS, None, 1)
        return params
    if scheme.kind == "nvfp4":  # schemes/compressed_tensors_w4a4_nvfp4.py create_weights
        params = {
            "weight_packed": Param(("U8",), (n, k // 2)),
            "weight_scale": Param(("F8_E4M3",), (n, k // 16)),
            "weight_global_scale": Param(("F32",), None, 1),
        }
        if a is not None:
            params["input_global_scale"] = Param(("F32",), None, 1)
        return params
    # schemes/compressed_tensors_wNa16.py create_weights
    bits, group = w.num_bits, scheme.group_size
    groups = 1 if group == -1 else k // group
    params = {
        "weight_packed": Param(("I32",), (n, math.ceil(k * bits / 32))),
        "weight_scale": Param(FLOATS, (n, groups)),
        "weight_shape": Param(("I64",), (2,)),
    }
    if not w.symmetric:
        params["weight_zero_point"] = Param(("I32",), (math.ceil(n * bits / 32), groups))
    return params


def logical_nk(
    layer: Layer, scheme: Scheme | None, want: tuple[int | None, int | None]
) -> tuple[int, int] | None:
    """[N, K] of a layer from its primary tensor (the config's sizes where the packing hides K)."""
    t = layer.tensors
    if scheme is None or scheme.kind == "fp8":
        w = t.get("weight")
        return (w.shape[0], w.shape[1]) if w is not None and len(w.shape) == 2 else None
    w = t.get("weight_packed")
    if w is None or len(w.shape) != 2:
        return None
    if scheme.kind == "nvfp4":
        return w.shape[0], w.shape[1] * 2
    bits = scheme.weights.num_bits
    k = (
        want[1]
        if want[1] is not None and math.ceil(want[1] * bits / 32) == w.shape[1]
        else w.shape[1] * 32 // bits
    )
    return w.shape[0], k
