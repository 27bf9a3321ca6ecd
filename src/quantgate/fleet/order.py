"""The order a serving engine loads an artifact's files in, which pieces are fetched in.

Engines (vLLM, SGLang, TensorRT-LLM) read the config and tokenizer first, then the safetensors
index, then the shards in the order the index first names them (layer 0 is in the first shard
the index names). So a loader that streams can start on the first shard while the last is still
on its way. The order is computed from the manifest's own file table (whose order is the
build's, and signed: reordering it would change every manifest's sha256); the BitTorrent v2
file tree is sorted by name, so it cannot carry an order either.
"""

from __future__ import annotations

import json
from pathlib import Path

from quantgate.contracts.artifact import MANIFEST

INDEX_SUFFIX = ".safetensors.index.json"


def load_order(files: list[str], directory: Path | None = None) -> list[str]:
    """``files`` (names relative to the artifact) in load order: the manifest (and its signature),
    small JSON and tokenizer files, the index, shards as the index names them, anything else."""

    def shards_in_index() -> list[str]:
        for rel in files:
            if rel.endswith(INDEX_SUFFIX) and directory is not None and (directory / rel).is_file():
                try:
                    weight_map = json.loads((directory / rel).read_text()).get("weight_map", {})
                except (OSError, ValueError, AttributeError):
                    return []
                if isinstance(weight_map, dict):
                    return list(dict.fromkeys(str(v) for v in weight_map.values()))
        return []

    indexed = {name: i for i, name in enumerate(shards_in_index())}

    def key(rel: str) -> tuple:
        if rel == MANIFEST or rel.startswith(MANIFEST):
            return (0, rel)
        if rel.endswith(INDEX_SUFFIX):
            return (2, rel)
        if rel.endswith(".safetensors"):
            return (3, indexed.get(rel, len(indexed)), rel)
        if rel.endswith((".json", ".jinja", ".txt", ".model")):
            return (1, rel)
        return (4, rel)

    return sorted(files, key=key)
