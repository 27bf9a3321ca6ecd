"""The ``quantization_config`` an FP8_DYNAMIC artifact carries, as llm-compressor writes it.

It is built by compressed-tensors' own classes, exactly as llm-compressor's ``model_free_ptq``
builds it, and depends only on the compressed-tensors version, the scheme, the ignore list and
whether anything was quantized. Importing compressed-tensors imports transformers, which costs
as much CPU as the quantization itself (BENCHMARKS.md), so the result is cached under a key of
exactly those inputs and computed (in a side thread) only the first time an environment needs it.
"""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path
from typing import Any

from quantgate.config import cache_dir
from quantgate.runtime.atomic import write_json

SCHEME = "FP8_DYNAMIC"


def build_config(ignore: list[str], quantized: bool) -> dict[str, Any]:
    """Computed afresh: compressed-tensors' ``QuantizationConfig`` in status COMPRESSED."""
    import torch
    from compressed_tensors import __version__
    from compressed_tensors.base import (
        COMPRESSION_VERSION_NAME,
        QUANTIZATION_METHOD_NAME,
        TRANSFORM_CONFIG_NAME,
    )
    from compressed_tensors.compressors.format import infer_module_format
    from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus, preset_name_to_scheme

    scheme = preset_name_to_scheme(SCHEME, ["Linear"])
    if quantized:  # llm-compressor records the format a module was compressed with
        scheme.format = infer_module_format(torch.nn.Linear, scheme)
    config = QuantizationConfig(
        config_groups={SCHEME: scheme},
        ignore=ignore,
        quantization_status=QuantizationStatus.COMPRESSED,
        format=scheme.format.value if scheme.format else "dense",
    )
    return {
        COMPRESSION_VERSION_NAME: __version__,
        QUANTIZATION_METHOD_NAME: "compressed-tensors",
        TRANSFORM_CONFIG_NAME: {},
        **config.model_dump(),
    }


def quantization_config(ignore: list[str], quantized: bool, cache: Path | None = None) -> dict[str, Any]:
    """The config, from the cache (``cache``, else the user's) when this compressed-tensors version
    has built it before."""
    key = json.dumps([metadata.version("compressed-tensors"), SCHEME, list(ignore), quantized])
    path = (
        (cache or cache_dir())
        / "stream_fp8"
        / f"quantization_config-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    )
    try:
        cached = json.loads(path.read_text())
        if cached.get("key") == key:
            return cached["config"]
    except (OSError, ValueError, AttributeError):
        pass
    config = build_config(ignore, quantized)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"key": key, "config": config})
    return config
