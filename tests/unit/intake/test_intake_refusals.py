"""Every refusal intake makes: its own error type, a message naming the file (or tensor) and the
fix, and the checkpoint directory left exactly as it was (the ``refuse`` fixture checks all three).
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from quantgate.intake import weights
from quantgate.runtime.errors import (
    CheckpointConfigError,
    CorruptSafetensorsError,
    EmptyCheckpointError,
    MissingShardError,
    NonFiniteWeightsError,
    PickleFileError,
    RemoteCodeError,
    ShapeMismatchError,
    SymlinkEscapeError,
)

pytestmark = pytest.mark.unit


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


# --- not a checkpoint at all ---------------------------------------------------------------


def test_missing_path(tmp_path, refuse):
    refuse(tmp_path / "nowhere", EmptyCheckpointError, "nowhere", "does not exist")


def test_a_file_is_not_a_checkpoint(tiny_llama, refuse):
    refuse(tiny_llama / "config.json", EmptyCheckpointError, "config.json", "not a directory")


def test_empty_directory(tmp_path, refuse):
    (tmp_path / "empty").mkdir()
    refuse(tmp_path / "empty", EmptyCheckpointError, "empty", "no .safetensors")


def test_directory_without_weights(tiny_llama, refuse):
    (tiny_llama / "model.safetensors").unlink()
    refuse(tiny_llama, EmptyCheckpointError, str(tiny_llama), "no .safetensors")


def test_weights_only_in_a_subdirectory(tiny_llama, refuse):
    (tiny_llama / "original").mkdir()
    (tiny_llama / "model.safetensors").rename(tiny_llama / "original" / "model.safetensors")
    refuse(tiny_llama, EmptyCheckpointError, str(tiny_llama), "only in subdirectories")


def test_safetensors_without_tensors(tiny_llama, refuse):
    save_file({}, tiny_llama / "model.safetensors")
    refuse(tiny_llama, EmptyCheckpointError, "no tensors")


# --- dangerous content ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "rel", ["pytorch_model.bin", "weights.pt", "a.pth", "opt.pkl", "sub/dir/last.ckpt", "X.BIN"]
)
def test_pickle_files_are_refused(tiny_llama, refuse, rel):
    target = tiny_llama / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"\x80\x04\x95not-really-a-pickle")
    err = refuse(tiny_llama, PickleFileError, rel, "safetensors")
    assert err.path == str(target)


def test_auto_map_in_config_is_refused(tiny_llama, refuse):
    edit_json(tiny_llama / "config.json", auto_map={"AutoModelForCausalLM": "modeling_x.XForCausalLM"})
    refuse(tiny_llama, RemoteCodeError, "config.json", "auto_map")


def test_auto_map_in_tokenizer_config_is_refused(tiny_llama, refuse):
    edit_json(tiny_llama / "tokenizer_config.json", auto_map={"AutoTokenizer": ["tok.T", None]})
    refuse(tiny_llama, RemoteCodeError, "tokenizer_config.json", "auto_map")


@pytest.mark.parametrize("rel", ["modeling_custom.py", "code/helpers.py"])
def test_python_files_are_refused(tiny_llama, refuse, rel):
    (tiny_llama / rel).parent.mkdir(parents=True, exist_ok=True)
    (tiny_llama / rel).write_text("import os\n")
    refuse(tiny_llama, RemoteCodeError, rel, "remote code")


@pytest.mark.parametrize(
    "points_to", ["outside_file", "outside_dir", "/etc/passwd", "../../tiny-llama-sibling"]
)
def test_symlinks_escaping_the_checkpoint_are_refused(tiny_llama, tmp_path, refuse, points_to):
    (tmp_path / "outside_file").write_text("secret")
    (tmp_path / "outside_dir").mkdir()
    (tmp_path / "tiny-llama-sibling").mkdir()
    target = (
        points_to if points_to.startswith(("/", "..")) else str(tmp_path / points_to)
    )  # sibling shares a name prefix
    (tiny_llama / "nested").mkdir()
    os.symlink(target, tiny_llama / "nested" / "link")
    refuse(tiny_llama, SymlinkEscapeError, "nested/link", "outside the checkpoint")


def test_symlink_chain_that_ends_outside_is_refused(tiny_llama, tmp_path, refuse):
    (tmp_path / "secret").write_text("x")
    os.symlink(str(tmp_path / "secret"), tiny_llama / "hop2")
    os.symlink("hop2", tiny_llama / "hop1")
    refuse(tiny_llama, SymlinkEscapeError, "hop", "outside the checkpoint")


def test_dangling_symlink_is_refused(tiny_llama, refuse):
    os.symlink("missing.json", tiny_llama / "dangling.json")
    refuse(tiny_llama, SymlinkEscapeError, "dangling.json", "does not exist")


# --- config.json ---------------------------------------------------------------------------


def test_missing_config(tiny_llama, refuse):
    (tiny_llama / "config.json").unlink()
    refuse(tiny_llama, CheckpointConfigError, "config.json", "missing")


def test_config_not_json(tiny_llama, refuse):
    (tiny_llama / "config.json").write_text('{"model_type": "llama",')
    refuse(tiny_llama, CheckpointConfigError, "config.json", "not valid JSON")


def test_config_not_an_object(tiny_llama, refuse):
    (tiny_llama / "config.json").write_text("[1, 2, 3]")
    refuse(tiny_llama, CheckpointConfigError, "config.json", "not a JSON object")


def test_config_without_model_type(tiny_llama, refuse):
    edit_json(tiny_llama / "config.json", model_type=None)
    refuse(tiny_llama, CheckpointConfigError, "config.json", "model_type")


@pytest.mark.parametrize("value", [None, [], "LlamaForCausalLM"])
def test_config_without_architectures(tiny_llama, refuse, value):
    edit_json(tiny_llama / "config.json", architectures=value)
    refuse(tiny_llama, CheckpointConfigError, "config.json", "architectures")


def test_unknown_model_type(tiny_llama, refuse):
    edit_json(tiny_llama / "config.json", model_type="no_such_family")
    refuse(tiny_llama, CheckpointConfigError, "config.json", "no_such_family")


def test_tokenizer_config_not_json(tiny_llama, refuse):
    (tiny_llama / "tokenizer_config.json").write_text("{oops")
    refuse(tiny_llama, CheckpointConfigError, "tokenizer_config.json", "not valid JSON")


# --- safetensors files ---------------------------------------------------------------------


def test_truncated_weights(tiny_llama, refuse):
    path = tiny_llama / "model.safetensors"
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)
    refuse(tiny_llama, CorruptSafetensorsError, "model.safetensors", "offsets past the end of the file")


def test_weights_cut_inside_the_header(tiny_llama, refuse):
    path = tiny_llama / "model.safetensors"
    with open(path, "r+b") as f:
        f.truncate(100)
    refuse(tiny_llama, CorruptSafetensorsError, "model.safetensors", "header longer than the file")


def _rewrite_header(path: Path, mutate) -> None:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    mutate(header)
    new = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n :])


def test_overlapping_tensors_in_weights(tiny_llama, refuse):
    def overlap(header):
        names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
        first, second = header[names[0]], header[names[1]]
        second["data_offsets"] = [
            first["data_offsets"][0],
            first["data_offsets"][0] + (second["data_offsets"][1] - second["data_offsets"][0]),
        ]

    _rewrite_header(tiny_llama / "model.safetensors", overlap)
    refuse(tiny_llama, CorruptSafetensorsError, "model.safetensors", "overlap")


def test_wrong_byte_span_in_weights(tiny_llama, refuse):
    _rewrite_header(tiny_llama / "model.safetensors", lambda h: h["model.norm.weight"].update(shape=[63]))
    refuse(tiny_llama, CorruptSafetensorsError, "model.safetensors", "model.norm.weight", "spans")


def test_weights_header_not_json(tiny_llama, refuse):
    raw = b'{"model.norm.weight": {"dtype": "BF16",'
    (tiny_llama / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    refuse(tiny_llama, CorruptSafetensorsError, "model.safetensors", "not valid JSON")


def test_corrupt_safetensors_anywhere_in_the_tree(tiny_llama, refuse):
    (tiny_llama / "extras").mkdir()
    (tiny_llama / "extras" / "adapter.safetensors").write_bytes(b"\x00\x01")
    refuse(tiny_llama, CorruptSafetensorsError, "extras/adapter.safetensors", "shorter than 8 bytes")


# --- weights against the config ------------------------------------------------------------


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_weights(tiny_llama, refuse, value):
    path = tiny_llama / "model.safetensors"
    tensors = load_file(path)
    tensors["model.layers.1.mlp.down_proj.weight"][3, 5] = value
    save_file(tensors, path, metadata={"format": "pt"})
    err = refuse(
        tiny_llama, NonFiniteWeightsError, "model.safetensors", "model.layers.1.mlp.down_proj.weight"
    )
    assert ("1 NaN" in str(err)) == math.isnan(value)


def test_non_finite_fp8_values_are_found_by_the_scan(tmp_path):
    """An FP8 source weight is refused for its dtype before the scan (test_hostile_checkpoints), but
    the scan itself still reads FP8 as FP8: a NaN code there is found, not passed as a byte."""
    norm = torch.ones(64, dtype=torch.float32)
    norm[2] = float("nan")
    save_file({"norm.weight": norm.to(torch.float8_e4m3fn)}, tmp_path / "x.safetensors")
    headers = weights.read_headers(tmp_path, ["x.safetensors"])
    tensors = weights.collect_tensors(tmp_path, ["x.safetensors"], ["x.safetensors"], headers)
    with pytest.raises(NonFiniteWeightsError, match="'norm.weight' holds 1 NaN"):
        weights.scan_finite(tmp_path, tensors, headers)


def test_intermediate_size_disagrees_with_weights(tiny_llama, refuse):
    edit_json(tiny_llama / "config.json", intermediate_size=256)
    refuse(tiny_llama, ShapeMismatchError, "model.safetensors", "mlp.", "128", "256")


def test_vocab_size_disagrees_with_embedding(tiny_llama, refuse):
    edit_json(tiny_llama / "config.json", vocab_size=1024)
    refuse(tiny_llama, ShapeMismatchError, "model.safetensors", "model.embed_tokens.weight", "vocab_size")


@pytest.mark.parametrize("declared", [8, 3])
def test_mixtral_expert_count_disagrees_with_router(tiny_mixtral, refuse, declared):
    """Mixtral's router is ``block_sparse_moe.gate`` on disk and ``mlp.gate`` in memory: compared
    through transformers' own renaming."""
    edit_json(tiny_mixtral / "config.json", num_local_experts=declared)
    refuse(
        tiny_mixtral,
        ShapeMismatchError,
        "model.safetensors",
        "model.layers.0.block_sparse_moe.gate.weight",
        "[4, 64]",
        f"[{declared}, 64]",
    )


def test_mixtral_experts_missing_on_disk_are_counted(tiny_mixtral, refuse):
    """Experts are stored one per tensor on disk but fused in memory: counted, not compared."""
    path = tiny_mixtral / "model.safetensors"
    tensors = {k: v for k, v in load_file(path).items() if ".experts.3." not in k}
    save_file(tensors, path, metadata={"format": "pt"})
    refuse(tiny_mixtral, ShapeMismatchError, "block_sparse_moe.experts", "3 experts", "4 experts")


def test_qwen_moe_expert_count_disagrees_with_router(tiny_qwen_moe, refuse):
    edit_json(tiny_qwen_moe / "config.json", num_experts=8)
    refuse(tiny_qwen_moe, ShapeMismatchError, "model.safetensors", "mlp.gate.weight", "[4, 64]", "[8, 64]")


def test_missing_embedding(tiny_llama, refuse):
    path = tiny_llama / "model.safetensors"
    tensors = load_file(path)
    del tensors["model.embed_tokens.weight"]
    save_file(tensors, path, metadata={"format": "pt"})
    refuse(tiny_llama, ShapeMismatchError, "model.embed_tokens.weight")


# --- sharded checkpoints -------------------------------------------------------------------


def _index(checkpoint: Path, weight_map) -> Path:
    path = checkpoint / "model.safetensors.index.json"
    path.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


def test_index_naming_a_missing_shard(tiny_llama, refuse):
    weight_map = dict.fromkeys(load_file(tiny_llama / "model.safetensors"), "model.safetensors")
    weight_map["lm_head.weight"] = "model-00002-of-00002.safetensors"
    _index(tiny_llama, weight_map)
    refuse(tiny_llama, MissingShardError, "model.safetensors.index.json", "model-00002-of-00002.safetensors")


def test_index_placing_a_tensor_in_the_wrong_shard(tiny_llama, refuse):
    weight_map = dict.fromkeys(load_file(tiny_llama / "model.safetensors"), "model.safetensors")
    weight_map["model.layers.9.mlp.up_proj.weight"] = "model.safetensors"
    _index(tiny_llama, weight_map)
    refuse(tiny_llama, MissingShardError, "model.safetensors.index.json", "model.layers.9.mlp.up_proj.weight")


@pytest.mark.parametrize(
    "content",
    [
        '{"weight_map": ',
        "[]",
        '{"metadata": {}}',
        '{"weight_map": {"a": 3}}',
        '{"weight_map": {"a": "../x.safetensors"}}',
    ],
)
def test_malformed_index(tiny_llama, refuse, content):
    (tiny_llama / "model.safetensors.index.json").write_text(content)
    refuse(tiny_llama, MissingShardError, "model.safetensors.index.json")


def test_tensor_stored_in_two_shards(tiny_llama, refuse):
    tensors = load_file(tiny_llama / "model.safetensors")
    save_file({"lm_head.weight": tensors["lm_head.weight"]}, tiny_llama / "model-extra.safetensors")
    weight_map = dict.fromkeys(tensors, "model.safetensors")
    weight_map["lm_head.weight"] = "model-extra.safetensors"  # the index names both shards
    _index(tiny_llama, weight_map)
    refuse(tiny_llama, CorruptSafetensorsError, "lm_head.weight", "stored twice")
