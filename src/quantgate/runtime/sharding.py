"""One model over the processes of a host: transformers' tensor-parallel plans under torchrun.

Why transformers' plans and not a sharding layer of our own: a model's plan (``base_model_tp_plan``:
q/k/v and gate/up column-wise, o/down row-wise, the lm_head gathered) is kept by its authors
for every architecture transformers loads, and it is the layout a serving engine's tensor
parallelism uses (vLLM's ColumnParallelLinear / RowParallelLinear). transformers loads each
rank's slice of the bf16 tensors and installs the collectives on the module's forward; the
evaluation's own modules (``EmulatedLinear``, ``NativeFP8Linear``, ``Float32GemmLinear``) replace
those linears afterwards, so ``replace`` cuts each to this rank's slice by the same style and
installs the same style's forward on it: a replaced linear communicates as the one it replaced.

What changes with the number of processes, as it does in a TP engine: a row-wise layer quantizes
its input's per-token (or per-group) scale over this rank's slice of the features, and the
partial products are summed across ranks in bf16 after each row-wise layer. A reference is
therefore keyed by the process count (``evaluate.runner.reference_path``), and the numbers at 1
and at N processes agree within the numerics spread, not bit for bit
(tests/integration/test_sharded_eval.py).

Every rank runs the same evaluation on the same items (SPMD): the row-wise all-reduce and the
lm_head's all-gather leave every rank with the same logits, so every decision taken from them
(skips, sequential stops) is the same on every rank; the decisions taken from files (is a
reference cached?) are rank 0's (``agree``), and only rank 0 writes (``writer``).

Launch: ``quantgate eval --devices N`` re-runs itself under ``torch.distributed.run`` with N
processes (``launch``); a process that torchrun started (``WORLD_SIZE`` set) joins its group
(``join``): NCCL on CUDA, one GPU per process, and gloo on the CPU, where N processes of one
host are the tested stand-in for N GPUs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from quantgate.runtime.errors import InputError, UsageError

# the plan's styles a replaced linear may carry, by how its weight is cut
_COLUMN = frozenset({"colwise", "colwise_gather_output", "colwise_rep"})
_ROW = frozenset({"rowwise", "rowwise_split_input", "rowwise_rep"})
_LOCAL = "_quantgate_local"  # set on a module already cut to this rank's slice
_EXPERTS = "moe_tp_experts"  # a MoE layer's experts: each expert's MLP cut, the layer's output summed
# (module name on disk, a tensor's shape) -> (dim, start, length) of this rank's slice, or None: whole
Slicer = Callable[[str, tuple[int, ...]], tuple[int, int, int] | None]
_HEADS = ("num_attention_heads", "num_key_value_heads")  # what must split over the processes


@dataclass(frozen=True)
class Shards:
    """This process's place among the processes one model is spread over."""

    world: int
    rank: int
    local_rank: int

    @property
    def writer(self) -> bool:
        """Rank 0 writes results, caches and the summary; the others compute beside it."""
        return self.rank == 0

    def describe(self, device: str) -> dict[str, Any]:
        """run.json's ``shards``: how the model was spread."""
        return {
            "processes": self.world,
            "backend": "nccl" if device == "cuda" else "gloo",
            "engine": "transformers tp_plan under torch.distributed.run",
        }


def current() -> Shards | None:
    """The group this process was started in by torchrun, or None when it runs alone."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world <= 1:
        return None
    rank = int(os.environ["RANK"])
    return Shards(world, rank, int(os.environ.get("LOCAL_RANK", rank)))


def writer() -> bool:
    """Whether this process writes (always, unless it is a rank other than 0 of a group)."""
    shards = current()
    return shards is None or shards.writer


def processes() -> int:
    """How many processes the model is spread over (1 alone)."""
    shards = current()
    return 1 if shards is None else shards.world


def notes() -> tuple[str, ...]:
    """The numerics' note on the spread, for every model evaluated in a group (none alone)."""
    world = processes()
    if world == 1:
        return ()
    note = (
        f"tensor parallel over {world} processes (the model's transformers plan): row-wise layers quantize "
        "their inputs over this rank's slice of the features and sum the partial products in bf16, "
        "as a tensor-parallel serving engine does"
    )
    return (note,)


def count(requested: str | None, device: str, config: Path | None = None) -> int:
    """The number of processes ``--devices`` asks for. A count is taken as given (on the CPU, that
    many processes over gloo). ``all`` (the default) is one process on the CPU, and on CUDA the
    most GPUs torch sees that the model's heads split over (``config``: its config.json, when
    known; a 9-head model on 8 GPUs runs on 3), so a worker's default never refuses a model."""
    name = (requested or "all").strip().lower()
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    if name == "all":
        return max((n for n in range(1, gpus + 1) if _splits(config, n)), default=1)
    if not name.isdigit() or int(name) < 1:
        raise UsageError(
            "--devices", f"{requested!r} is not a number of devices", "pass all or a count such as 2"
        )
    wanted = int(name) if len(name) <= 9 else 10**9
    cores = len(os.sched_getaffinity(0))
    if device != "cuda" and wanted > cores:  # one process per device: more than cores is no speed-up
        raise UsageError(
            "--devices",
            f"{name if len(name) <= 9 else 'over 10^9'} processes asked for on the CPU, this host has "
            f"{cores} core(s) for them",
            f"pass at most {cores} (or all)",
        )
    if device == "cuda" and wanted > gpus:
        raise UsageError(
            "--devices",
            f"{wanted} GPUs asked for, torch sees {gpus}",
            "pass at most the GPUs this worker has, or all",
        )
    return wanted


def _splits(config: Path | None, processes: int) -> bool:
    """Whether the model of ``config`` splits its attention and KV heads over ``processes`` (unknown
    model: only 1)."""
    if processes == 1:
        return True
    if config is None or not config.is_file():
        return False
    from quantgate.runtime import bounded_json

    try:
        values = bounded_json.parse(bounded_json.read_bytes(config, 4 << 20))
    except (OSError, ValueError, bounded_json.JsonRefused):  # intake names what is wrong with it
        return False
    text = values.get("text_config", values) if isinstance(values, dict) else {}
    heads = [text.get(k) for k in _HEADS]
    return all(not isinstance(h, int) or h % processes == 0 for h in heads)


def launch(processes: int, argv: list[str]) -> int:
    """Run this command again under ``torch.distributed.run`` with ``processes`` processes on
    this host and return its exit status (the first failing rank's)."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={processes}",
        "--module",
        "quantgate.cli",
        *argv,
    ]
    return subprocess.run(command, check=False).returncode


def join(device: str) -> Shards | None:
    """Join the group torchrun started, if any (idempotent): NCCL with this rank's GPU, or gloo on
    the CPU. None when this process runs alone."""
    shards = current()
    if shards is None:
        return None
    import torch.distributed as dist

    if not dist.is_initialized():
        if device == "cuda":
            torch.cuda.set_device(shards.local_rank)
        dist.init_process_group(backend="nccl" if device == "cuda" else "gloo")
    return shards


def load_kwargs(directory: Path, config: Any, device: str) -> dict[str, Any]:
    """``from_pretrained``'s arguments for this process's slice of the model in ``directory``
    (none when it runs alone); a model whose heads do not split over the processes is refused
    before anything is loaded."""
    shards = join(device)
    if shards is None:
        return {}
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key in _HEADS:
        heads = getattr(text, key, None)
        if isinstance(heads, int) and heads % shards.world:
            raise InputError(
                directory / "config.json",
                f"{key} is {heads}, which does not split over {shards.world} processes",
                f"pass a --devices that divides {heads}",
            )
    from torch.distributed.device_mesh import init_device_mesh

    return {
        "tp_plan": _plan_without_experts(config),
        "device_mesh": init_device_mesh(device, (shards.world,)),
    }


def _is_experts(key: str) -> bool:
    return ".experts" in f".{key}"


def _plan_without_experts(config: Any) -> dict[str, str] | str:
    """An artifact's plan for ``from_pretrained`` with its MoE experts left out: transformers would
    cut the compressed per-expert tensors itself, and its weight conversion fails on them (FP8,
    seen on a tiny Mixtral); the evaluation replaces the experts with its own module, which
    ``replace`` cuts by the style held back here (``style``). "auto" (the model's own plan) for a
    model without experts, and for a bf16 source, whose experts transformers cuts itself."""
    quantized = getattr(config, "quantization_config", None) is not None
    if not quantized or not any(_is_experts(k) for k in (config.base_model_tp_plan or {})):
        return "auto"
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    return {k: v for k, v in (skeleton.tp_plan or {}).items() if not _is_experts(k)}


def agree(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (the value itself when alone): a decision read from files,
    which a rank could otherwise take differently and then wait forever in another collective."""
    if current() is None:
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def style(model: nn.Module, name: str) -> str | None:
    """The tensor-parallel style the loaded model's plan gives module ``name`` (None: replicated)."""
    if current() is None:
        return None
    from transformers.distributed.tensor_parallel import replace_layer_number_by_wildcard

    key = replace_layer_number_by_wildcard(name)
    plan: dict[str, str] = getattr(model, "tp_plan", None) or {}
    if key in plan:
        return plan[key]
    # the experts' styles, held back from the load (``_plan_without_experts``): the base model's own
    base: dict[str, str] = getattr(getattr(model, "config", None), "base_model_tp_plan", None) or {}
    held = {k: v for k, v in base.items() if _is_experts(k)}
    return held.get(key.removeprefix(f"{getattr(model, 'base_model_prefix', '')}."))


def full(tensor: Tensor) -> Tensor:
    """A parameter's whole value: a DTensor shard is gathered (every rank calls it, in order)."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def replace(model: nn.Module, name: str, module: nn.Module) -> None:
    """Put ``module`` at ``name`` in ``model``; in a group, cut to this rank's slice of the style
    the plan gives ``name`` and given that style's forward, so it communicates as the module it
    replaces. A module made from one already cut (a native kernel from an emulated linear) is
    installed as it is."""
    parent, _, child = name.rpartition(".")
    owner = model.get_submodule(parent) if parent else model
    wanted = style(model, name)
    if wanted == _EXPERTS:
        shards = current()
        assert shards is not None
        if not is_cut(module):
            _cut_experts(module, name, shards)
        _sum_over_ranks(module)
    elif wanted is not None:
        shards = current()
        assert shards is not None
        if not is_cut(getattr(owner, child)) and not is_cut(module):
            _cut(module, name, wanted, shards)
        from transformers.distributed.tensor_parallel import ALL_PARALLEL_STYLES

        # transformers' local-tensor path for modules that are not nn.Linear (its quantized ones)
        setattr(module, "_hf_quantized_needs_local_tp", True)  # noqa: B010 (not a declared attribute)
        mark_cut(module)
        ALL_PARALLEL_STYLES[wanted].install_forward(module, model._device_mesh)
    setattr(owner, child, module)


def _cut_experts(module: nn.Module, name: str, shards: Shards) -> None:
    """A MoE layer's experts cut as vLLM's tensor-parallel fused MoE cuts them: every expert's gate
    and up projections column-wise (its slice of the intermediate features), its down projection
    row-wise, so each rank computes every routed token's partial down products over its slice. The
    module keeps its experts as ``gate``, ``up`` and ``down`` lists of linears (``QuantizedExperts``);
    one that does not is refused with the way out."""
    lists = [
        experts
        for key in ("gate", "up", "down")
        if isinstance(experts := getattr(module, key, None), nn.ModuleList)
    ]
    if len(lists) != 3:
        raise InputError(
            name,
            f"the model's tensor-parallel plan shards these experts, and {type(module).__name__} keeps no "
            "gate/up/down lists of expert linears to cut",
            "evaluate it on one device: --devices 1",
        )
    gate, up, down = lists
    for index, (g, u, d) in enumerate(zip(gate, up, down, strict=True)):
        _cut(g, f"{name}.{index}.gate_proj", "colwise", shards)
        _cut(u, f"{name}.{index}.up_proj", "colwise", shards)
        _cut(d, f"{name}.{index}.down_proj", "rowwise", shards)
    mark_cut(module)


def slicer(style_of: Callable[[str], str | None], rename: Callable[[str], str]) -> Slicer | None:
    """In a group: the slice of each quantized tensor on disk this rank reads
    (``numerics.artifact.read_modules``), so that no rank holds, let alone decodes, the
    whole model (a 70B's weights decoded to float32 are twice an H200). The cut is ``_cut``'s and
    ``_cut_experts``'s: a column-wise module (an expert's gate and up) by its output features,
    every tensor along them (weight, packed weight, scales, bias); a row-wise one (an expert's
    down) by its input features, every 2-D tensor whose extent along them is more than one
    (weights, packed weights, per-group scales; a per-channel scale and the bias stay whole).
    Global scales stay whole. None when alone. ``style_of``: a module's read style by its memory
    name (``numerics.artifact.read_style``: the plan's, an expert's by its role; None: whole);
    ``rename``: disk names to memory names."""
    shards = current()
    if shards is None:
        return None

    def where(module: str, shape: tuple[int, ...]) -> tuple[int, int, int] | None:
        wanted = style_of(rename(module))
        if wanted is None or not shape:
            return None
        dim = 0 if wanted in _COLUMN else 1
        if len(shape) <= dim or shape[dim] <= 1:
            return None
        start, step = _rank_slice(module, shape[dim], "rows or groups along the split", shards)
        return dim, start, step

    return where


def linear_style(model: nn.Module, name: str) -> str | None:
    """The plan's column- or row-wise style of linear ``name`` (None: replicated, or another style)."""
    wanted = style(model, name)
    return wanted if wanted in _COLUMN or wanted in _ROW else None


def read_shape(out_features: int, in_features: int, wanted: str | None) -> tuple[int, int]:
    """A Linear's weight shape as this rank reads it under read style ``wanted`` (None: whole)."""
    if wanted is None:
        return out_features, in_features
    world = processes()
    return (out_features // world, in_features) if wanted in _COLUMN else (out_features, in_features // world)


def read_cut(module: nn.Module, wanted: str) -> None:
    """A module built from tensors ``slicer`` read: marked cut, and, for a row-wise one, its bias
    kept by rank 0 alone (it is added once, after the sum over ranks), as ``_cut`` leaves it."""
    shards = current()
    assert shards is not None
    if wanted in _ROW and not shards.writer and getattr(module, "bias", None) is not None:
        _set(module, "bias", None)
    mark_cut(module)


def cuts_experts(model: nn.Module, name: str) -> bool:
    """Whether this process is one of a group whose plan cuts the experts module ``name``."""
    return style(model, name) == _EXPERTS


def mark_cut(module: nn.Module) -> None:
    """Record that ``module`` already holds only this rank's slice (read so from disk): ``replace``
    installs it without cutting it again."""
    setattr(module, _LOCAL, True)


def is_cut(module: nn.Module) -> bool:
    """Whether ``module`` holds only this rank's slice (``replace`` cut it)."""
    return bool(getattr(module, _LOCAL, False))


def _sum_over_ranks(module: nn.Module) -> None:
    """``module``'s output summed over the group after its forward (in its own dtype, bf16 for a MoE
    layer, as vLLM all-reduces the fused MoE's output): the ranks' partial down products joined."""
    import torch.distributed as dist

    forward = module.forward

    def summed(*args: Any, **kwargs: Any) -> Tensor:
        out = forward(*args, **kwargs)
        dist.all_reduce(out)
        return out

    module.forward = summed


def _rank_slice(name: str, extent: int, what: str, shards: Shards) -> tuple[int, int]:
    """This rank's ``(start, length)`` of ``extent`` rows, features or groups, which must divide
    evenly over the group (``name``: the module, for the error)."""
    if extent % shards.world:
        raise InputError(
            name,
            f"{extent} {what} do not divide over {shards.world} processes",
            "pass a --devices that divides them",
        )
    step = extent // shards.world
    return shards.rank * step, step


def _cut(module: nn.Module, name: str, wanted: str, shards: Shards) -> None:
    """``module``'s tensors narrowed to this rank's slice: output features (dim 0 of the weight,
    per-channel scales and bias) for a column-wise style, input features (dim 1 of the weight and
    of per-group scales) for a row-wise one, whose bias is added once, by rank 0."""
    out_features, in_features = int(module.out_features), int(module.in_features)  # type: ignore[arg-type]
    if wanted in _COLUMN:
        dim, size = 0, out_features
    elif wanted in _ROW:
        dim, size = 1, in_features
    else:
        raise InputError(
            name,
            f"the model's tensor-parallel plan gives this module the style {wanted!r}, which quantgate's "
            "emulated modules do not take",
            "evaluate it on one device: --devices 1",
        )
    _rank_slice(name, size, "features", shards)
    for key, tensor in [*module.named_buffers(recurse=False), *module.named_parameters(recurse=False)]:
        if tensor is None or key == "bias":
            continue
        if tensor.ndim == 2 and tensor.shape[dim] > 1 and size % tensor.shape[dim] == 0:
            # the weight, or its per-channel / per-group scales (groups must not straddle two ranks)
            start, step = _rank_slice(name, tensor.shape[dim], f"{key} groups along the split", shards)
            _set(module, key, tensor.narrow(dim, start, step).contiguous())
    bias = getattr(module, "bias", None)
    if bias is not None and dim == 0:
        step = out_features // shards.world
        _set(module, "bias", bias.narrow(0, shards.rank * step, step).contiguous())
    elif bias is not None and not shards.writer:
        _set(module, "bias", None)
    if dim == 0:
        module.out_features = out_features // shards.world  # type: ignore[assignment]
    else:
        module.in_features = in_features // shards.world  # type: ignore[assignment]


def _set(module: nn.Module, key: str, value: Tensor | None) -> None:
    """Replace a buffer or parameter in place of its registration."""
    if key in module._parameters:
        module._parameters[key] = None if value is None else nn.Parameter(value, requires_grad=False)
    else:
        module._buffers[key] = value
