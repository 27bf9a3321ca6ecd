"""Mixture-of-experts: per-expert quantized weights run the way vLLM's fused MoE kernels run them.

transformers 5 keeps a layer's experts as two fused parameters (``gate_up_proj`` [E, 2I, H],
gate rows first, and ``down_proj`` [E, H, I]); artifacts store one module per expert and
projection (``experts.{e}.gate_proj`` / ``up_proj`` / ``down_proj``, Mixtral ``w1`` / ``w3`` /
``w2``), with its own scales. The experts module is replaced by ``QuantizedExperts``, which
holds one ``EmulatedLinear`` per expert and projection (on an FP8 GPU, ``native.apply_native``
replaces an FP8 W8A8 layer with ``native.NativeFP8Experts``, the experts stacked for one grouped
GEMM per projection), rather than decoding into the fused layout, because:

- the fused parameters are bf16 tensors, and ``grid value x scale`` does not fit bf16 (an FP8
  value times a bf16 channel scale has up to 12 significant bits): the same rounding that
  ``load.py`` refuses for Linear layers;
- the kernel quantizes activations twice per expert (its input, and the gated intermediate
  before the down projection) and applies NVFP4's global scales after each GEMM: transformers'
  expert forwards (eager, grouped_mm, batched_mm) have no place for either, so a fused layout
  would need a replacement forward anyway;
- one ``EmulatedLinear`` per projection reuses the decoders, activation formats and float32
  matmul that the Linear path is tested on, expert by expert.

The router and the shared experts are not touched: routers stay bf16 in every artifact (the
recipes ignore them) and run as transformers runs them for the source, and shared experts are
plain Linear layers (``EmulatedLinear`` through the Linear path). What this module reproduces,
read from vLLM's source:

- NVFP4 (``CompressedTensorsW4A4Nvfp4MoEMethod.process_weights_after_loading``, compressed-
  tensors MoE method): the fused gate/up GEMM takes one weight global scale per expert, the
  gate's (``w13_weight_global_scale[:, 0]``, a warning if the up scale differs), so the up
  projection is divided by the gate's. Input global scales: on the FlashInfer backends, which
  ``select_nvfp4_moe_backend`` (fused_moe/oracle/nvfp4.py) tries first on Blackwell,
  ``prepare_nvfp4_moe_layer_for_fi_or_cutlass`` shares one scale across all experts of a layer
  (``a13_scale.max()`` of the reciprocals: the smallest ``input_global_scale`` of every gate and
  up projection; the same for the down projections).
- FP8 W8A8 (channel weights, dynamic per-token activations; ROCm converts to fnuz as for
  Linear layers): per-token scales do not depend on the expert, so per-expert emulation is
  the kernel's quantization exactly.
- The combination follows vLLM's Triton ``fused_moe``: gate/up written in bf16, SiLU-and-mul
  in float32 written in bf16, the routing weight multiplied into the float32 down-projection
  accumulator before its bf16 store, and the top-k contributions summed in bf16 in routing
  order (``moe_sum``). Other backends order these roundings differently, within a bf16 ulp.
"""

from __future__ import annotations

import abc
import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, cast

import torch
from torch import Tensor, nn

from quantgate.numerics.emulated import EmulatedLinear
from quantgate.numerics.formats import ActivationFormat
from quantgate.numerics.weights import DecodedWeight

# on-disk projection name -> role in the fused layout
_ROLES = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down", "w1": "gate", "w3": "up", "w2": "down"}
_EXPERT = re.compile(r"^(?P<prefix>.+\.experts)\.(?P<index>\d+)\.(?P<proj>[A-Za-z0-9_]+)$")


@dataclass(frozen=True)
class ExpertNames:
    """Checkpoint names of one expert's projections, as a serving engine's loader matches them."""

    gate: str
    up: str
    down: str

    def all(self) -> tuple[str, str, str]:
        """The three names, gate, up, down."""
        return (self.gate, self.up, self.down)


# vLLM's per-model ``get_expert_mapping`` -> ``FusedMoE.make_expert_params_mapping(ckpt_gate_proj_name=...,
# ckpt_down_proj_name=..., ckpt_up_proj_name=...)``, which matches ``experts.{e}.{name}.`` in each
# checkpoint key: model_executor/models/mixtral.py (w1, w2, w3); qwen2_moe.py, qwen3_moe.py and
# deepseek_v2.py (DeepSeek-V2/V3: gate_proj, down_proj, up_proj). A key that matches no mapping
# is looked up as an ordinary parameter and fails to load.
_VLLM_EXPERT_NAMES = {"mixtral": ExpertNames("w1", "w3", "w2")}
_DEFAULT_EXPERT_NAMES = ExpertNames("gate_proj", "up_proj", "down_proj")


def vllm_expert_names(model_type: str) -> ExpertNames:
    """The per-expert projection names vLLM's MoE loader expects for ``model_type``."""
    return _VLLM_EXPERT_NAMES.get(model_type, _DEFAULT_EXPERT_NAMES)


def expert_key(name: str) -> tuple[str, int, str] | None:
    """``(experts module, expert index, projection)`` for a per-expert module name, else None."""
    match = _EXPERT.match(name)
    if match is None or match["proj"] not in _ROLES:
        return None
    return match["prefix"], int(match["index"]), match["proj"]


def role(projection: str) -> str:
    """``gate``, ``up`` or ``down`` for a per-expert projection's name on disk (``w1``, ``up_proj``...)."""
    return _ROLES[projection]


def is_fused_experts(module: nn.Module | None) -> bool:
    """A transformers experts module with the fused gate_up_proj [E, 2I, H] / down_proj [E, H, I] layout."""
    if module is None:
        return False
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    return (
        isinstance(gate_up, Tensor)
        and isinstance(down, Tensor)
        and gate_up.ndim == 3
        and down.ndim == 3
        and gate_up.shape[0] == down.shape[0]
        and gate_up.shape[1] == 2 * down.shape[2]
        and gate_up.shape[2] == down.shape[1]
    )


class ExpertLayoutError(ValueError):
    """One layer's per-expert tensors do not fit its fused experts module (the caller names the file)."""


@dataclass(frozen=True)
class ExpertWeights:
    """One expert's three projections, decoded, with the input global scales the kernel uses."""

    gate: DecodedWeight
    up: DecodedWeight
    down: DecodedWeight


def plan_layer(
    fused: nn.Module,
    experts: dict[int, dict[str, dict[str, Tensor]]],
    decode: Callable[[dict[str, Tensor]], DecodedWeight],
    *,
    shards: int = 1,
) -> tuple[list[ExpertWeights], list[str]]:
    """Decode every expert of one layer (``{index: {projection name: tensors}}``); also returns notes.

    Refuses missing experts or projections, a mix of naming schemes, and shapes that do not fit
    the fused module (``shards``: the tensors are one rank's slice of the intermediate features of
    so many, ``sharding.slicer``). NVFP4: the up projection takes the gate's weight global
    scale, as vLLM's fused gate/up GEMM does; a note counts the experts where that changes the weights.
    """
    gate_up: Tensor = fused.gate_up_proj  # type: ignore[assignment]  # checked by is_fused_experts
    n_experts, two_i, hidden = gate_up.shape
    intermediate = two_i // 2 // shards
    if sorted(experts) != list(range(n_experts)):
        found = sorted(experts)
        raise ExpertLayoutError(
            f"the artifact stores experts {found[:3]}..{found[-1:]} ({len(found)}), the model has {n_experts}"
        )
    schemes = {frozenset(projections) for projections in experts.values()}
    if len(schemes) != 1 or len(next(iter(schemes))) != 3:
        raise ExpertLayoutError(
            f"experts store projections {sorted(map(sorted, schemes))}, expected one gate/up/down set"
        )
    names = next(iter(schemes))
    roles = {_ROLES[name]: name for name in names}
    if set(roles) != {"gate", "up", "down"}:
        raise ExpertLayoutError(
            f"projections {sorted(names)} do not name a gate, an up and a down projection"
        )
    want = {"gate": (intermediate, hidden), "up": (intermediate, hidden), "down": (hidden, intermediate)}
    decoded: list[ExpertWeights] = []
    shifted = 0
    for index in range(n_experts):
        parts = {}
        for role, name in roles.items():
            weight = decode(experts[index][name])
            if tuple(weight.values.shape) != want[role]:
                raise ExpertLayoutError(
                    f"expert {index} {name} decodes to {tuple(weight.values.shape)}, the model expects {want[role]}"
                )
            parts[role] = weight
        gate, up = parts["gate"], parts["up"]
        if gate.global_scale is not None:
            if up.global_scale is None or not torch.equal(up.global_scale, gate.global_scale):
                shifted += 1
            up = dataclasses.replace(up, global_scale=gate.global_scale)
        decoded.append(ExpertWeights(gate=gate, up=up, down=parts["down"]))
    notes = []
    if shifted:
        notes.append(
            f"{shifted} of {n_experts} experts store an up_proj weight global scale that differs from gate_proj's; "
            "the fused gate/up GEMM uses the gate's for both (vLLM warns 'w1_weight_global_scale must match "
            "w3_weight_global_scale'), and so does this evaluation"
        )
    return decoded, notes


def shared_input_scales(experts: dict[int, dict[str, dict[str, Tensor]]]) -> tuple[Tensor, Tensor]:
    """NVFP4: one input global scale for every gate/up GEMM of a layer and one for every down GEMM,
    the smallest calibrated ones, as vLLM's FlashInfer NVFP4 MoE backends use them."""
    w13: list[Tensor] = []
    w2: list[Tensor] = []
    for projections in experts.values():
        for name, tensors in projections.items():
            scale = tensors.get("input_global_scale")
            if scale is None:
                raise ExpertLayoutError(f"{name} has no input_global_scale, which NVFP4 activations need")
            (w2 if _ROLES[name] == "down" else w13).append(scale.float().reshape(()))
    return torch.stack(w13).min(), torch.stack(w2).min()


@dataclass(frozen=True)
class Routes:
    """A layer's (token, slot) pairs sorted by expert, stably (each expert's rows in token order),
    as a grouped GEMM takes them: expert ``e``'s rows are ``ends[e-1]:ends[e]``; rows from
    ``ends[-1]`` on were routed to no expert."""

    order: Tensor  # [T*k] the flat (token * k + slot) index of each sorted row
    token: Tensor  # [T*k] the token of each sorted row
    weight: Tensor  # [T*k, 1] the routing weight of each sorted row
    ends: Tensor  # [E] int32, cumulative row counts


def route(top_k_index: Tensor, top_k_weights: Tensor, num_experts: int) -> Routes:
    """Sort a layer's routing by expert on the device, without a host sync: one sort where a loop
    over ``unique`` experts and ``where`` waited for the GPU once per expert."""
    k = top_k_index.shape[1]
    flat = top_k_index.reshape(-1)
    # transformers' sentinel for a token routed to no expert lies outside [0, E): the last bucket
    bucket = torch.where((flat >= 0) & (flat < num_experts), flat, num_experts)
    order = torch.argsort(bucket, stable=True)
    counts = torch.bincount(bucket, minlength=num_experts + 1)[:num_experts]
    return Routes(
        order=order,
        token=order // k,
        weight=top_k_weights.reshape(-1)[order].unsqueeze(-1),
        ends=counts.cumsum(0).to(torch.int32),
    )


class RoutedExperts(nn.Module, abc.ABC):
    """A layer's experts called like transformers' experts module:
    ``(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k]) -> [T, H]``. Routing and the
    combination are here, once; a subclass computes the routed rows (``routed``)."""

    native: ClassVar[bool] = False  # on the hardware's own kernel (``native.NativeFP8Experts``)
    act_fn: Callable[[Tensor], Tensor]

    def __init__(
        self,
        num_experts: int,
        act_fn: Callable[[Tensor], Tensor],
        *,
        activation: ActivationFormat | None,
        weight_format: str,
        notes: tuple[str, ...] = (),
    ) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.act_fn = act_fn
        self.activation = activation
        self.weight_format = weight_format
        self.notes = notes

    @property
    @abc.abstractmethod
    def intermediate(self) -> int:
        """Each expert's intermediate features (on a rank of a group, its slice of them)."""

    @abc.abstractmethod
    def routed(self, hidden_states: Tensor, routes: Routes) -> Tensor:
        """Each sorted row's contribution [T*k, H]: its token through its expert, times its routing
        weight before the bf16 store. Rows routed to no expert may hold anything."""

    @torch.no_grad()
    def forward(self, hidden_states: Tensor, top_k_index: Tensor, top_k_weights: Tensor) -> Tensor:
        """Every token through its top-k experts, weighted and summed in routing order."""
        tokens, k = top_k_index.shape
        routes = route(top_k_index, top_k_weights, self.num_experts)
        rows = self.routed(hidden_states, routes)
        to_an_expert = torch.arange(rows.shape[0], device=rows.device) < routes.ends[-1]
        contributions = torch.empty_like(rows)
        contributions[routes.order] = torch.where(to_an_expert.unsqueeze(-1), rows, 0)
        contributions = contributions.view(tokens, k, -1)
        out = contributions[:, 0]
        for slot in range(1, k):  # moe_sum: bf16 additions in routing order
            out = (out.float() + contributions[:, slot].float()).to(hidden_states.dtype)
        return out

    def extra_repr(self) -> str:
        """Expert count and formats, for ``print(model)``."""
        activation = self.activation.name if self.activation is not None else "none"
        kernel = ", kernel=torch._scaled_mm" if self.native else ""
        return f"experts={self.num_experts}, weights={self.weight_format}, activations={activation}{kernel}"


def expert_bounds(routes: Routes) -> list[tuple[int, int, int]]:
    """``(expert, start, end)`` of every expert that has rows, for a loop over experts (one host sync)."""
    bounds, start = [], 0
    for index, end in enumerate(routes.ends.tolist()):
        if end > start:
            bounds.append((index, start, end))
        start = end
    return bounds


class QuantizedExperts(RoutedExperts):
    """A layer's experts with quantized weights and activations, each expert's projections an
    ``EmulatedLinear`` (on an FP8 GPU, ``native.apply_native`` replaces a whole FP8 W8A8 layer with
    ``NativeFP8Experts``)."""

    def __init__(
        self,
        experts: list[ExpertWeights],
        activation: ActivationFormat | None,
        act_fn: Callable[[Tensor], Tensor],
        *,
        weight_format: str,
        input_scales: tuple[Tensor, Tensor] | None = None,
        compute_dtype: torch.dtype = torch.float32,
        notes: tuple[str, ...] = (),
    ) -> None:
        super().__init__(
            len(experts),
            act_fn,
            activation=activation,
            weight_format=weight_format,
            notes=notes,
        )
        w13_scale, w2_scale = input_scales if input_scales is not None else (None, None)

        def linear(weight: DecodedWeight, scale: Tensor | None) -> EmulatedLinear:
            return EmulatedLinear(
                weight,
                activation,
                weight_format=weight_format,
                input_global_scale=scale,
                compute_dtype=compute_dtype,
            )

        self.gate = nn.ModuleList(linear(e.gate, w13_scale) for e in experts)
        self.up = nn.ModuleList(linear(e.up, w13_scale) for e in experts)
        self.down = nn.ModuleList(linear(e.down, w2_scale) for e in experts)

    @property
    def intermediate(self) -> int:
        """Each expert's intermediate features, as its gate holds them (``sharding`` may cut them)."""
        return cast(EmulatedLinear, self.gate[0]).out_features

    def expert(self, index: int, x: Tensor, routing_weight: Tensor) -> Tensor:
        """One expert's contribution for ``x`` [N, H]: its down projection times each token's routing
        weight [N, 1], multiplied before the bf16 store (``EmulatedLinear.weighted``)."""
        gate, up = self.gate[index], self.up[index]
        down = cast(EmulatedLinear, self.down[index])
        gated = (self.act_fn(gate(x).float()) * up(x).float()).to(x.dtype)
        return down.weighted(gated, routing_weight)

    def routed(self, hidden_states: Tensor, routes: Routes) -> Tensor:
        """Expert by expert over its contiguous rows."""
        x = hidden_states[routes.token]
        rows = torch.zeros_like(x)
        for index, start, end in expert_bounds(routes):
            rows[start:end] = self.expert(index, x[start:end], routes.weight[start:end])
        return rows

    def linears(self) -> tuple[EmulatedLinear, ...]:
        """Every expert's projections: gates, ups, downs."""
        return cast(tuple[EmulatedLinear, ...], (*self.gate, *self.up, *self.down))
