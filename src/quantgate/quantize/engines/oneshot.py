"""Calibrated targets (NVFP4, GPTQ/AWQ INT4) through llm-compressor's ``oneshot``.

The recipe's ``recipe:`` block is handed to ``oneshot`` verbatim. One engine instance serves every
calibrated target of a build: the source is loaded and the calibration set tokenized once, and
each target but the last quantizes its own copy, so N calibrated targets cost one load, and one
target holds the model once. MoE models get one Linear per expert (llm-compressor's
``linearize_moe``) and calibrate every expert on every token: an expert a small calibration set
never routes to would otherwise get no activation statistics.
"""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path
from typing import Any

from quantgate.config import KVCache, Recipe
from quantgate.intake import SourceRecord
from quantgate.quantize.engines._logs import quiet
from quantgate.quantize.engines.base import BuildJob, register
from quantgate.quantize.kv_calibration import with_kv_cache_scheme
from quantgate.quantize.preflight import check_group_sizes
from quantgate.runtime.errors import BuildError, CalibrationError
from quantgate.runtime.units import format_bytes

# the largest file of an artifact, as the hub's checkpoints are cut (a streamed FP8 artifact keeps
# its source's files): the manifest hashes one file per core, and llm-compressor's own default,
# 20 GB, wrote an 8B NVFP4 artifact as one 6 GB file that took 7.3 s to hash on one core of the H200
SHARD_SIZE = "5GB"

# the share of a GPU's free memory a model calibrated whole (the basic pipeline) may take: the rest
# holds a calibration batch's activations, the observers' statistics and compression's work tensors
_GPU_SHARE = 0.8


def _caches_a_latent(source: SourceRecord) -> bool:
    """Multi-head latent attention: config.json (or its text_config) gives ``kv_lora_rank``, as
    vLLM's ``ModelConfig.use_mla`` and transformers' DeepSeek-V2/V3 read it."""
    config = json.loads((Path(source.path) / "config.json").read_text(encoding="utf-8"))
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    return isinstance(text, dict) and text.get("kv_lora_rank") is not None


def _linearize(model: Any) -> None:
    """Replace every fused experts module of a loaded model by one Linear per expert, in place.

    Not ``load_quantizable_moe``: for the model types it has per-expert load mappings for
    (Qwen2/Qwen3-MoE, DeepSeek-V3, ...) it loads through transformers' ``apply_patches``, which
    calls ``dir()`` on every ``transformers.*`` module in ``sys.modules`` outside its try block;
    the ``image_processing_*_fast`` aliases import their target on ``dir()``, and those import
    torchvision, so the load failed without it. It also left its save mapping registered for the
    model type process-wide. The post-load split (``linearize_moe``, what it does itself for the
    types without mappings, Mixtral) copies the same bf16 values, registers nothing, and saves
    the experts as ``experts.N.gate_proj/up_proj/down_proj`` (``quantize/expert_names.py`` renames
    them where the source's own names differ).
    """
    from llmcompressor.modeling.moe.linearize import get_linearized_moes, linearize_moe

    linearize_moe(model)
    if not get_linearized_moes(model):
        raise BuildError(
            f"{model.name_or_path}/config.json: a mixture-of-experts model whose experts module "
            f"({model.config.model_type}) llm-compressor cannot split into one Linear per expert; "
            "build it with a data-free target (hopper-fp8) or register the module with llm-compressor"
        )


def _latent_inputs_as_tokens(model: Any) -> None:
    """Hand multi-head latent attention's ``kv_b_proj`` its input as ``[batch, tokens, rank]``.

    transformers 5.17's DeepSeek-V3 attention (``expand_kv``) views the cached latent as one
    head, ``[batch, 1, tokens, kv_lora_rank]``, and calls ``kv_b_proj`` on that. llm-compressor's
    activation observers take a Linear's input as ``[batch, tokens, hidden]``
    (``observers/helpers.py`` ``_flatten_activation`` merges the first two dims), so for this
    input the NVFP4 ``static_minmax`` observer kept one statistic per token position, and the
    second calibration sample, of another length, failed to combine with the first ("size of
    tensor a (379) must match ... b (512)"). A pre-hook, registered before llm-compressor's and
    so run first, drops the head dim: the same values, and the observer sees tokens as tokens.
    ``expand_kv`` reshapes the output by ``view(batch, tokens, heads, dims)``, which takes it
    either way. Samples keep their lengths: the calibration data is the same as every model's.
    """
    if getattr(model.config, "kv_lora_rank", None) is None:
        return

    def as_tokens(_module: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        x = args[0]
        if x.dim() == 4 and x.shape[1] == 1:
            return (x.flatten(1, 2), *args[1:])
        return None

    for name, module in model.named_modules():
        if name.endswith(".kv_b_proj"):
            module.register_forward_pre_hook(as_tokens)


@register("llmcompressor.oneshot")
class OneshotEngine:
    """llm-compressor's ``oneshot`` for calibrated recipes, one source load per build call."""

    def __init__(self) -> None:
        self._loaded: dict[str, tuple[Any, Any]] = {}  # content hash -> (model, tokenizer)
        # builds still to come per compute dtype (one per preflight): the last one calibrates the
        # loaded source itself, not a copy, so a build call of one target holds the model once
        self._uses: dict[str, int] = {}
        # an FP8 KV decision adds kv_cache_scheme to the recipe; else the build's KV pass calibrates
        self.calibrates_kv_cache = True

    def preflight(self, source: SourceRecord, recipe: Recipe) -> None:
        """Refuse a recipe whose weight group size does not divide a layer it quantizes; decide who
        calibrates an FP8 KV cache.

        llm-compressor's ``kv_cache_scheme`` observes the keys and values transformers hands the
        attention function. Under multi-head latent attention those are per-head keys and values
        expanded from the latent by kv_b_proj, while vLLM's MLA caches the latent itself
        (kv_c_normed and the rotary k_pe, under k_scale): its scale would cover other numbers. For
        those models the build's KV pass over the built artifact (``kv_calibration.calibrate``, as
        for data-free builds) observes the latent instead.
        """
        _, args = recipe.modifier()
        check_group_sizes(source, recipe, ignore=list(args.get("ignore", [])))
        dtype = recipe.calibration.compute_dtype
        self._uses[dtype] = self._uses.get(dtype, 0) + 1
        self.calibrates_kv_cache = not _caches_a_latent(source)

    def _load(self, source: SourceRecord, dtype: str) -> tuple[Any, Any]:
        key = f"{source.content_hash}:{dtype}"
        if key not in self._loaded:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            model = AutoModelForCausalLM.from_pretrained(source.path, dtype=getattr(torch, dtype))
            if source.moe:
                _linearize(model)
            _latent_inputs_as_tokens(model)
            model.eval()
            tokenizer = AutoTokenizer.from_pretrained(source.path)
            self._loaded = {key: (model, tokenizer)}  # one source (in one dtype) at a time
        return self._loaded[key]

    def _dataset(self, job: BuildJob, tokenizer: Any):
        from datasets import Dataset

        if job.calibration is None:
            raise CalibrationError(
                f"recipes/{job.recipe.name}.yaml",
                "this recipe needs calibration data but no calibration set was given",
                "pass --calibration SPEC.yaml (default: calibration_sets/default.yaml)",
            )
        texts = job.calibration.texts()[: job.recipe.calibration.num_samples]
        encoded = tokenizer(
            texts, truncation=True, max_length=job.recipe.calibration.max_seq_length, add_special_tokens=True
        )
        return Dataset.from_dict(
            {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}
        )

    def _take(self, source: SourceRecord, dtype: str) -> tuple[Any, Any]:
        """The loaded source for one build to calibrate: a copy while another target will still
        calibrate this load (oneshot quantizes in place; the copy keeps ``name_or_path``, from which
        oneshot re-reads the config), the load itself for the last, which is then no longer kept."""
        base, tokenizer = self._load(source, dtype)
        self._uses[dtype] = self._uses.get(dtype, 1) - 1
        if self._uses[dtype] > 0:
            return copy.deepcopy(base), tokenizer
        self._loaded = {}
        return base, tokenizer

    def build(self, job: BuildJob) -> None:
        """Calibrate the loaded source (or a copy) with the recipe and save it compressed."""
        import yaml

        quiet()
        from llmcompressor import oneshot

        calibration = job.recipe.calibration
        model, tokenizer = self._take(job.source, calibration.compute_dtype)
        dataset = self._dataset(job, tokenizer)
        # only a recipe that names a pipeline passes one: oneshot's own default stays the default
        extra: dict[str, Any] = {}
        if calibration.pipeline:
            extra["pipeline"] = calibration.pipeline
        move = _place(job, model, extra)
        recipe = job.recipe.recipe
        if job.kv_cache == KVCache.FP8_E4M3 and self.calibrates_kv_cache:  # in the same pass
            recipe = with_kv_cache_scheme(recipe)
        with (
            job.progress.task(f"{job.recipe.name}: calibrating on {len(dataset)} samples", total=None),
            _onload_device(job.device),
        ):
            oneshot(
                model=model,
                tokenizer=tokenizer,
                recipe=yaml.safe_dump(recipe),  # oneshot takes YAML text, not a dict
                dataset=dataset,
                num_calibration_samples=len(dataset),
                max_seq_length=job.recipe.calibration.max_seq_length,
                shuffle_calibration_samples=False,
                moe_calibrate_all_experts=True,
                **extra,
            )
        with job.progress.task(f"{job.recipe.name}: writing compressed checkpoint", total=None):
            if calibration.compute_dtype != "bfloat16":
                # stored as every artifact is: the fake-quantized weights and their scales in bf16
                # (an int4 level times its scale survives the cast: |q| <= 8 is far inside bf16's
                # 2^-9 relative step, so compression recovers the same integers)
                import torch
                from compressed_tensors.offload.dispatch import remove_dispatch

                # on a GPU llm-compressor's pipeline leaves each layer dispatched (its weights in an
                # offload cache on the CPU, onloaded to the GPU per forward), and ``.to`` cast only
                # the onloaded copies: a GPU build saved float32 weights and config, which vLLM's
                # W4A16 kernels refuse; without the dispatch the cast reaches the stored tensors
                remove_dispatch(model)
                model.to(torch.bfloat16)
            model.save_pretrained(job.out_dir, save_compressed=True, max_shard_size=SHARD_SIZE)
            tokenizer.save_pretrained(job.out_dir)
        del model
        if move:
            import torch

            torch.cuda.empty_cache()


def _place(job: BuildJob, model: Any, extra: dict[str, Any]) -> bool:
    """Apply ``placement`` to this build: switch ``extra``'s pipeline when the model does not fit,
    saying so; move the model to the GPU when it does. True when it moved."""
    room, size = _room(job.device, job.max_memory), _bytes(model)
    pipeline, move = placement(extra.get("pipeline"), job.device, size, room)
    if pipeline != extra.get("pipeline"):
        job.progress.log(
            f"{job.recipe.name}: the model ({format_bytes(size)}) is larger than the "
            f"{format_bytes(room or 0)} it may take on the GPU: llm-compressor's {pipeline} pipeline "
            "onloads one layer at a time"
        )
        extra["pipeline"] = pipeline
    if move:
        model.to(job.device)
    return move


def placement(
    pipeline: str | None, device: str, model_bytes: int, room: int | None
) -> tuple[str | None, bool]:
    """(the pipeline ``oneshot`` runs, whether the model moves to ``device`` before it).

    The engine loads the source on the CPU (one load serves every calibrated target), and
    llm-compressor's basic pipeline computes wherever the model is: on a GPU worker an NVFP4 build
    observed its activations, computed its scales and compressed on the CPU (BENCHMARKS.md, issue
    29). On a GPU the model's copy moves there whole when it fits in ``room`` (``_room``); when it
    does not, the library's sequential pipeline onloads one layer at a time, which writes the same
    artifact for a recipe that only observes, as every basic-pipeline recipe does
    (``test_oneshot_pipeline.py``). The other pipelines onload to the accelerator themselves.
    """
    if device == "cpu" or pipeline != "basic":
        return pipeline, False
    if room is not None and model_bytes <= room:
        return pipeline, True
    return "sequential", False


def _bytes(model: Any) -> int:
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def _room(device: str, max_memory: int | None) -> int | None:
    """The bytes a model calibrated whole may take on ``device``: 80 % of its free memory, and no
    more than ``--max-memory`` (None on the CPU)."""
    if device == "cpu":
        return None
    import torch

    free, _ = torch.cuda.mem_get_info(torch.device(device))
    room = int(_GPU_SHARE * free)
    return room if max_memory is None else min(room, max_memory)


@contextlib.contextmanager
def _onload_device(device: str):
    """llm-compressor's pipelines onload each layer to ``get_main_device()``, the accelerator whenever
    there is one (offloading to the CPU between layers: the library's own sequential pipeline for
    models larger than GPU memory). ``device`` "cpu" keeps them on the CPU on a GPU machine too."""
    if device != "cpu":
        yield
        return
    import importlib

    import torch

    modules = [
        importlib.import_module(f"llmcompressor.pipelines.{name}.pipeline")
        for name in ("sequential", "data_free")
    ]
    saved = [getattr(m, "get_main_device") for m in modules]  # noqa: B009 (mypy: untyped module)
    try:
        for m in modules:
            setattr(m, "get_main_device", lambda: torch.device("cpu"))  # noqa: B010
        yield
    finally:
        for m, fn in zip(modules, saved, strict=True):
            setattr(m, "get_main_device", fn)  # noqa: B010
