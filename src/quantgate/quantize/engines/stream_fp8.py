"""FP8_DYNAMIC, streamed tensor by tensor: quantgate's own data-free FP8 engine.

Why not ``model_free_ptq``: it holds, rebuilds and re-serializes whole shards one step after
another, and was slower than loading the full model with ``oneshot`` (BENCHMARKS.md). Here each
output shard's header is written first, from the source headers, and a small thread pool reads,
quantizes and writes each tensor at its offset, so I/O and compute overlap and memory is a few
tensors whatever the shard size. The artifact is llm-compressor's: same names, shapes, dtypes
and shards, weights as ``fp8_channel`` computes them, the config as ``fp8_config`` builds it.
Fused 3-D expert tensors go to the ``llmcompressor.model_free`` engine unchanged.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantgate.config import Recipe
from quantgate.intake import SafetensorsHeader, SourceRecord, TensorInfo, model_files, read_header
from quantgate.quantize.engines._shard_io import DTYPES, OutTensor, ShardWriter, read_into
from quantgate.quantize.engines.base import BuildJob, register
from quantgate.quantize.engines.fp8_config import SCHEME, quantization_config
from quantgate.quantize.preflight import weight_group_size
from quantgate.runtime.errors import ConfigFileError, RecipeIncompatibleError

READAHEAD_BYTES = 256 * 1024**2
INDEX = "model.safetensors.index.json"
_FUSED_EXPERTS = ("gate_up_proj", "down_proj")  # 3-D in fused-expert checkpoints


@dataclass(frozen=True)
class Item:
    """One source tensor and what becomes of it."""

    shard: str
    name: str
    info: TensorInfo
    quantize: bool


def _ignore(recipe: Recipe) -> list[str]:
    kind, args = recipe.modifier()
    if kind == "QuantizationModifier" and args.get("scheme") != SCHEME:
        weight_group_size(args, f"recipes/{recipe.name}.yaml")  # an unknown scheme: suggests the nearest
    if (
        kind != "QuantizationModifier"
        or args.get("scheme") != SCHEME
        or set(args) - {"targets", "scheme", "ignore"}
    ):
        raise ConfigFileError(
            f"recipes/{recipe.name}.yaml",
            f"engine quantgate.stream_fp8 builds only a QuantizationModifier with scheme {SCHEME} "
            f"(targets, scheme, ignore), got {kind} with {sorted(args)}",
            "use engine llmcompressor.model_free for other data-free schemes",
        )
    if args.get("targets", ["Linear"]) != ["Linear"]:
        raise ConfigFileError(
            f"recipes/{recipe.name}.yaml",
            "engine quantgate.stream_fp8 targets Linear weights only",
            "targets: [Linear]",
        )
    return list(args.get("ignore", []))


def targeted(name: str, ignore: list[str]) -> bool:
    """Whether ``match_quantizable_tensors(..., ignore, targets=["Linear"])`` would yield ``name``.

    The same rule as compressed-tensors 0.19 (``utils/match.py``): parameter ``weight`` of any
    module not ending in ``norm`` (``Linear`` in targets means every module, by name), unless a
    module name matches an ignore entry (``re:`` entries with ``re.match``, others exactly).
    Restated here because importing compressed-tensors imports transformers, which costs more
    than the quantization (BENCHMARKS.md); ``test_stream_fp8.py`` checks it against the library
    on every tensor name of the test models.
    """
    module, _, param = name.rpartition(".")
    if module.endswith("norm") or param != "weight":
        return False
    return not any(
        re.match(ign.removeprefix("re:"), module) if ign.startswith("re:") else ign == module
        for ign in ignore
    )


def plan(
    source: Path, ignore: list[str], shards: list[str] | None = None
) -> tuple[dict[str, SafetensorsHeader], list[Item], bool]:
    """Source headers by shard, every tensor's fate in file order, and whether experts are fused.

    ``shards``: the weight files to read, intake's ``SourceRecord.weight_files``; by default the
    same rule intake applies to the directory (``weights.model_files``), never a glob: a weight
    file intake did not check is never converted.
    """
    if shards is None:
        shards = model_files(source, sorted(p.name for p in source.iterdir() if p.is_file()))
    headers = {shard: read_header(source / shard) for shard in shards}
    items: list[Item] = []
    fused = False
    for shard, header in headers.items():
        for name, info in sorted(header.tensors.items(), key=lambda kv: kv[1].begin):
            if len(info.shape) == 3 and any(k in name for k in _FUSED_EXPERTS):
                fused = True  # model_free_ptq splits these per expert before matching names
            elif targeted(name, ignore) and len(info.shape) != 2:
                raise RecipeIncompatibleError(
                    str(source / shard),
                    f"{name} is targeted for FP8 but has shape {list(info.shape)}, not a 2-D Linear weight",
                    "add its module to the recipe's ignore list with a stated reason",
                )
            items.append(Item(shard, name, info, targeted(name, ignore)))
    return headers, items, fused


@contextmanager
def _torch_threads(n: int):
    """Each worker computes on one thread: the workers, not torch, share out the cores."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _layouts(headers: dict[str, SafetensorsHeader], items: list[Item]) -> dict[str, list[OutTensor]]:
    """Every output tensor per shard, in source order; a quantized weight is followed by its scale."""
    layouts: dict[str, list[OutTensor]] = {s: [] for s in headers}
    for it in items:
        shape = tuple(it.info.shape)
        if it.quantize:
            layouts[it.shard].append(OutTensor(it.name, "F8_E4M3", shape))
            layouts[it.shard].append(OutTensor(f"{it.name}_scale", it.info.dtype, (shape[0], 1)))
        else:
            layouts[it.shard].append(OutTensor(it.name, it.info.dtype, shape))
    return layouts


class _Progress:
    """Bytes of source tensors the workers have started on, for the readahead thread to follow."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._bytes = 0
        self._done = False

    def add(self, nbytes: int) -> None:
        with self._cond:
            self._bytes += nbytes
            self._cond.notify_all()

    def finish(self) -> None:
        with self._cond:
            self._done = True
            self._cond.notify_all()

    def wait_below(self, threshold: int) -> bool:
        """Wait until the started bytes exceed ``threshold``; False once the work is over."""
        with self._cond:
            self._cond.wait_for(lambda: self._done or self._bytes > threshold)
            return not self._done


class _Buffers(threading.local):
    """Per-worker buffers sized for the largest weight, reused for every tensor.

    A fresh allocation per tensor costs a page fault per 4 KiB page the first time it is touched.
    """

    def __init__(self, nbytes: int, numel: int) -> None:
        import torch

        self.raw = torch.empty(nbytes, dtype=torch.uint8)
        self.scratch = torch.empty(nbytes, dtype=torch.uint8)
        self.fp8 = torch.empty(numel, dtype=torch.uint8)


def stream(
    source: Path,
    out_dir: Path,
    headers: dict[str, SafetensorsHeader],
    items: list[Item],
    workers: int | None = None,
    readahead: int = READAHEAD_BYTES,
) -> tuple[dict[str, str], int]:
    """Write the FP8 shards of ``source`` into ``out_dir``; return the weight map and data bytes.

    Workers take tensors in file order. A readahead thread asks the kernel
    (``POSIX_FADV_WILLNEED``) for up to ``readahead`` bytes beyond the tensors already started,
    so the disk keeps reading while both cores compute; 0 turns it off.
    """
    from quantgate.quantize.engines.fp8_channel import FP8, quantize_rows

    layouts = _layouts(headers, items)
    quantized = [it for it in items if it.quantize]
    buffers = _Buffers(
        max((it.info.nbytes for it in quantized), default=0),
        max((it.info.numel for it in quantized), default=0),
    )
    src_fds: dict[str, int] = {}
    writers: dict[str, ShardWriter] = {}
    started = _Progress()

    def prefetch() -> None:
        advised = 0
        for it in items:
            if not started.wait_below(advised - readahead):
                return
            start = headers[it.shard].data_offset + it.info.begin
            os.posix_fadvise(src_fds[it.shard], start, it.info.nbytes, os.POSIX_FADV_WILLNEED)
            advised += it.info.nbytes

    def work(it: Item) -> None:
        started.add(it.info.nbytes)
        writer, start = writers[it.shard], headers[it.shard].data_offset + it.info.begin
        if not it.quantize:
            writer.copy_from(it.name, src_fds[it.shard], start, it.info.nbytes)
            return
        dtype, shape, n = DTYPES[it.info.dtype], tuple(it.info.shape), it.info.nbytes
        read_into(src_fds[it.shard], buffers.raw[:n], start)
        q = buffers.fp8[: it.info.numel].view(FP8).view(shape)
        scale = quantize_rows(
            buffers.raw[:n].view(dtype).view(shape), buffers.scratch[:n].view(dtype).view(shape), q
        )
        writer.write(it.name, q)
        writer.write(f"{it.name}_scale", scale)

    reader = threading.Thread(target=prefetch, name="stream-fp8-readahead", daemon=True)
    try:
        for shard, layout in layouts.items():
            src_fds[shard] = os.open(source / shard, os.O_RDONLY)
            (out_dir / shard).parent.mkdir(parents=True, exist_ok=True)  # an index may name sub/x.safetensors
            writers[shard] = ShardWriter(out_dir / shard, layout, {"format": "pt"})
        if readahead > 0:
            reader.start()
        with _torch_threads(1), ThreadPoolExecutor(workers or min(4, os.cpu_count() or 1)) as pool:
            # every job is submitted at once; a job holds no memory until a worker runs it
            for _ in pool.map(work, items):
                pass
    finally:
        started.finish()
        if reader.is_alive():
            reader.join()
        for fd in src_fds.values():
            os.close(fd)
        for writer in writers.values():
            writer.close()
    weight_map = {t.name: shard for shard, layout in layouts.items() for t in layout}
    return weight_map, sum(t.nbytes for layout in layouts.values() for t in layout)


def write_metadata(
    source: Path, out_dir: Path, quant_config: dict[str, Any], weight_map: dict[str, str], total_size: int
) -> None:
    """Copy the non-weight files, then add the quantization config and the shard index.

    Both JSON files are written as llm-compressor writes them (indent 2, sorted keys).
    """
    for path in sorted(p for p in source.rglob("*") if p.is_file() and p.suffix != ".safetensors"):
        rel = path.relative_to(source)
        if rel.as_posix() != INDEX:
            (out_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, out_dir / rel)
    config_path = out_dir / "config.json"
    config = json.loads(config_path.read_text())
    config["quantization_config"] = quant_config
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True))
    index = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
    (out_dir / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True))


def build_fp8(
    source: Path,
    out_dir: Path,
    ignore: list[str],
    workers: int | None = None,
    readahead: int = READAHEAD_BYTES,
    shards: list[str] | None = None,
    cache: Path | None = None,
) -> int:
    """The whole artifact from a checkpoint directory; returns how many weights were quantized.

    Callable without a recipe or a source record, so that benchmarks time exactly this
    (``shards`` as in ``plan``; ``cache``: where the quantization config is kept, as in
    ``fp8_config.quantization_config``).
    """
    headers, items, _ = plan(source, ignore, shards)
    quantized = sum(it.quantize for it in items)
    with ThreadPoolExecutor(1, thread_name_prefix="stream-fp8-config") as side:
        config = side.submit(quantization_config, ignore, quantized > 0, cache)
        weight_map, total = stream(source, out_dir, headers, items, workers, readahead)
        write_metadata(source, out_dir, config.result(), weight_map, total)
    return quantized


@register("quantgate.stream_fp8")
class StreamFp8Engine:
    """The fp8-dynamic recipe, streamed by ``workers`` threads (default: one per core, at most 4)."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers

    def preflight(self, source: SourceRecord, recipe: Recipe) -> None:
        """Refuse any recipe but FP8_DYNAMIC on Linear weights, and targeted tensors that are not 2-D."""
        plan(Path(source.path), _ignore(recipe), source.weight_files)

    def build(self, job: BuildJob) -> None:
        """Stream the artifact into ``job.out_dir``; fused-expert checkpoints go to ``model_free``."""
        source, ignore = Path(job.source.path), _ignore(job.recipe)
        _, items, fused = plan(source, ignore, job.source.weight_files)
        if fused:
            from quantgate.quantize.engines.model_free import ModelFreeEngine

            job.progress.log(
                f"{job.recipe.name}: fused expert tensors, handing over to llmcompressor.model_free"
            )
            ModelFreeEngine().build(job)
            return
        with job.progress.task(f"{job.recipe.name}: streaming {len(items)} tensors", total=None):
            build_fp8(
                source, job.out_dir, ignore, self.workers, shards=job.source.weight_files, cache=job.cache_dir
            )
