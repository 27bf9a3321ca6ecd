"""The weights: which files hold them, that every header is sound, and that every value is finite.

A sharded checkpoint is described by ``*.safetensors.index.json``; the shards it names are the
model. Without an index, the top-level ``*.safetensors`` files are. Every ``.safetensors`` file
anywhere in the tree has its header validated (it is cheap), but only the model's files are
counted, compared with the config and scanned for NaN/Inf.

The scan reads one tensor at a time, a large one in 16 MB blocks, so its memory stays at a block
per file being scanned, not the model: source checkpoints are often larger than the machine.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch

from quantgate.intake import bounded_json
from quantgate.intake.safetensors_header import DTYPES, SafetensorsHeader, TensorInfo, read_header
from quantgate.runtime.errors import (
    CheckpointError,
    CorruptSafetensorsError,
    IncompleteCheckpointError,
    MissingShardError,
    NonFiniteWeightsError,
)
from quantgate.runtime.hashing import per_file
from quantgate.runtime.progress import SILENT, Progress
from quantgate.runtime.safe_path import path_problem

# dtypes that can hold NaN or Inf (E2M1/E2M3/E3M2 have no such encodings)
_SCANNED = frozenset(
    {"F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E4M3FNUZ", "F8_E5M2", "F8_E5M2FNUZ", "F8_E8M0", "C64"}
)
_NATIVE = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64)
BLOCK_BYTES = 16 * 1024 * 1024
INDEX = "model.safetensors.index.json"  # the only index transformers reads
SINGLE = "model.safetensors"  # what transformers reads when there is no index
# what a source weight may be stored as: the dtypes quantization reads (fp8_channel.SOURCE_DTYPES)
SOURCE_DTYPES = frozenset({"BF16", "F16", "F32"})

Tensors = dict[str, tuple[str, TensorInfo]]


def model_files(root: Path, files: list[str]) -> list[str]:
    """The files holding the model's weights, the one set intake checks and every engine reads.

    transformers loads ``model.safetensors.index.json``'s shards when it exists, else
    ``model.safetensors``; ``model_free_ptq`` and a directory glob read every ``*.safetensors``
    file instead. A top-level weight file outside the first set would be validated by nobody and
    converted by some engines (the NaN copy an artifact's index ended up pointing at), so it is
    refused: one file set per checkpoint. Weight files in subdirectories are not the model and
    are read by no engine (their headers are still validated).
    """
    top = [rel for rel in files if "/" not in rel]
    weights = [rel for rel in top if rel.endswith(".safetensors")]
    indexes = [rel for rel in top if rel.endswith(".safetensors.index.json")]
    for rel in indexes:
        if rel != INDEX:
            raise MissingShardError(
                root / rel,
                f"shard index '{rel}' is not the one transformers reads ({INDEX})",
                f"rename it to {INDEX}, or remove it together with the shards it names",
            )
    if not indexes:
        if weights and weights != [SINGLE]:
            if len(weights) == 1:
                problem = f"the weights are in '{weights[0]}', but without a shard index transformers loads only {SINGLE}"
                fix = f"rename it to {SINGLE}"
            else:
                problem = (
                    f"{len(weights)} weight files ({', '.join(weights[:3])}{', ...' if len(weights) > 3 else ''}) "
                    f"but no {INDEX}: transformers would load only {SINGLE} and other tools every file"
                )
                fix = (
                    f"add the {INDEX} that save_pretrained writes, or remove the files that are not the model"
                )
            raise IncompleteCheckpointError(root / weights[0], problem, fix)
        return weights
    present = set(files)
    shards: set[str] = set()
    for shard in _weight_map(root, INDEX).values():
        if shard not in present:
            raise MissingShardError(
                root / INDEX,
                f"the index names shard '{shard}', which does not exist in the checkpoint",
                "copy the missing shard into the checkpoint, or regenerate the index (save_pretrained)",
            )
        shards.add(shard)
    unindexed = sorted(set(weights) - shards)
    if unindexed:
        raise IncompleteCheckpointError(
            root / unindexed[0],
            f"weight file '{unindexed[0]}' is not named by {INDEX}"
            + (f" (nor are {len(unindexed) - 1} more)" if len(unindexed) > 1 else "")
            + ": transformers would ignore it but other tools would convert it, unchecked",
            f"remove it (or move it into a subdirectory), or regenerate {INDEX} so that it names every shard",
        )
    return sorted(shards)


def _weight_map(root: Path, rel: str) -> dict[str, str]:
    path = root / rel
    fix = (
        "regenerate the index with save_pretrained (it must hold a 'weight_map' of tensor name -> shard file)"
    )
    try:
        index = bounded_json.parse(bounded_json.read_bytes(path, bounded_json.INDEX_BYTES).decode("utf-8"))
    except bounded_json.JsonRefused as exc:
        raise MissingShardError(path, f"shard index {exc.problem}", fix) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MissingShardError(path, f"shard index is not valid JSON ({exc})", fix) from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise MissingShardError(path, "shard index has no 'weight_map' object", fix)
    for name, shard in weight_map.items():  # a file name read from data: safe_path's one check
        if not (isinstance(shard, str) and shard.endswith(".safetensors") and path_problem(shard) is None):
            raise MissingShardError(
                path, f"tensor '{name}' maps to {shard!r}, not a .safetensors file in the checkpoint", fix
            )
    return weight_map


def read_headers(root: Path, files: list[str]) -> dict[str, SafetensorsHeader]:
    """Validated headers of every .safetensors file in the tree."""
    return {rel: read_header(root / rel) for rel in files if rel.endswith(".safetensors")}


def collect_tensors(
    root: Path, files: list[str], shards: list[str], headers: dict[str, SafetensorsHeader]
) -> Tensors:
    """Tensor name -> (file, info) over the model's files; names unique, index consistent."""
    tensors: Tensors = {}
    for rel in shards:
        for name, info in headers[rel].tensors.items():
            if name in tensors:
                raise CorruptSafetensorsError(
                    root / rel,
                    f"tensor '{name}' is stored twice (also in {tensors[name][0]})",
                    "keep each tensor in exactly one shard: re-save the checkpoint with save_pretrained",
                )
            tensors[name] = (rel, info)
    if INDEX in files:
        weight_map = _weight_map(root, INDEX)
        for name, shard in weight_map.items():
            if name not in headers[shard].tensors:
                raise MissingShardError(
                    root / INDEX,
                    f"the index places tensor '{name}' in '{shard}', but that shard does not hold it",
                    "regenerate the index with save_pretrained, or copy the right shard",
                )
        # loaders that place tensors by the index (vLLM, transformers' sharded loading) would leave
        # an omitted one uninitialised, though intake and the build read it from its shard
        omitted = sorted(name for name in tensors if name not in weight_map)
        if omitted:
            raise MissingShardError(
                root / INDEX,
                f"the index omits tensor '{omitted[0]}' (in '{tensors[omitted[0]][0]}')"
                + (
                    f" and {len(omitted) - 1:,} more of the {len(tensors):,} its shards hold"
                    if len(omitted) > 1
                    else ""
                )
                + ": a loader that places tensors by the index would leave them uninitialised",
                "regenerate the index with save_pretrained so that it names every tensor of its shards",
            )
    return tensors


def check_source_dtypes(root: Path, tensors: Tensors) -> None:
    """Refuse a checkpoint whose weights are not stored in bf16, fp16 or fp32.

    Every target quantizes from high precision: an int8 or FP8 ``*.weight`` means the source is
    already quantized (or mislabelled), and an engine would fail on it after the output directory
    exists. Refused here, before anything is written. Other tensors (integer buffers, say) are
    not weights and may hold any dtype.
    """
    for name, (rel, info) in sorted(tensors.items()):
        if name.endswith(".weight") and info.dtype not in SOURCE_DTYPES:
            raise CheckpointError(
                root / rel,
                f"weight '{name}' is stored as {DTYPES[info.dtype][1]}: quantgate builds from bf16, fp16 or "
                "fp32 weights, and this checkpoint looks already quantized",
                "pass the unquantized (bf16/fp16/fp32) checkpoint the model was trained or released as",
            )


def count_params(tensors: Tensors) -> int:
    """Parameters of the model: elements of every tensor in its files."""
    return sum(info.numel for _, info in tensors.values())


def dominant_dtype(tensors: Tensors) -> str:
    """Torch-style name of the floating dtype holding the most bytes (any dtype if none floats)."""
    floating: Counter[str] = Counter()
    every: Counter[str] = Counter()
    for _, info in tensors.values():
        every[info.dtype] += info.nbytes
        if DTYPES[info.dtype][2]:
            floating[info.dtype] += info.nbytes
    ranked = (floating or every).most_common(1)
    return DTYPES[ranked[0][0]][1] if ranked else "none"


def scan_finite(
    root: Path,
    tensors: Tensors,
    headers: dict[str, SafetensorsHeader],
    progress: Progress = SILENT,
    skip: frozenset[str] | set[str] = frozenset(),
) -> None:
    """Refuse the first tensor that holds a NaN or an Inf, naming it and its file (files in
    ``skip`` passed this scan before, unchanged since).

    Reads with plain ``readinto`` into one buffer per file, reused for every block, rather than
    through ``safe_open``'s memory map: mapped pages a scan has touched count as this process's
    resident memory until the file is closed (BENCHMARKS.md).
    """
    by_file: dict[str, list[str]] = {}
    for name, (rel, _) in tensors.items():
        if rel not in skip:
            by_file.setdefault(rel, []).append(name)
    total = sum(tensors[name][1].nbytes for names in by_file.values() for name in names)

    def scan_file(rel: str, advance) -> tuple[str, int, int] | None:
        """The first non-finite tensor of one file, as (name, NaN count, Inf count), or None."""
        buffer = bytearray(BLOCK_BYTES)
        base = headers[rel].data_offset
        with open(root / rel, "rb", buffering=0) as fh:
            for name in sorted(by_file[rel], key=lambda n: tensors[n][1].begin):
                info = tensors[name][1]
                if info.dtype in _SCANNED and info.numel:
                    nan, inf = _count_nonfinite(fh, base + info.begin, info, buffer)
                    if nan or inf:
                        return name, nan, inf
                advance(info.nbytes)
        return None

    rels = sorted(by_file)
    with progress.task("scanning weights for NaN/Inf", total=total) as task:
        found = per_file(lambda rel: scan_file(rel, task.advance), rels, "scan")
    # the first bad file in name order, whichever thread finished first
    for rel, bad in zip(rels, found, strict=True):
        if bad is not None:
            name, nan, inf = bad
            raise NonFiniteWeightsError(
                root / rel,
                f"tensor '{name}' holds {nan} NaN and {inf} infinite values",
                "re-export the weights from a healthy training step; quantization cannot "
                "produce finite scales from non-finite weights",
            )


def _count_nonfinite(fh, offset: int, info: TensorInfo, buffer: bytearray) -> tuple[int, int]:
    dtype = getattr(torch, DTYPES[info.dtype][1])
    itemsize = DTYPES[info.dtype][0] // 8
    step = len(buffer) - len(buffer) % itemsize
    nan = inf = 0
    fh.seek(offset)
    remaining = info.nbytes
    while remaining:
        n = fh.readinto(memoryview(buffer)[: min(step, remaining)])
        if not n:
            raise CorruptSafetensorsError(fh.name, "file ended inside a tensor", "re-copy the file")
        block = torch.frombuffer(buffer, dtype=dtype, count=n // itemsize)
        if dtype not in _NATIVE:
            block = block.float()
        if not bool(torch.isfinite(block).all()):
            nan += int(torch.isnan(block).sum())
            inf += int(torch.isinf(block).sum())
        remaining -= n
    return nan, inf
