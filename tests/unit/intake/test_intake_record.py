"""Intake of sound checkpoints: the record's fields, MoE detection, the content hash, progress."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
from pathlib import Path

import blake3
import pytest
from pydantic import ValidationError
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from quantgate.intake import SourceRecord, intake, read_header
from support.models import write_tiny_model

pytestmark = pytest.mark.unit


def all_files(directory: Path) -> dict[str, int]:
    return {
        p.relative_to(directory).as_posix(): p.stat().st_size for p in directory.rglob("*") if p.is_file()
    }


def tensor_numels(path: Path) -> dict[str, int]:
    with safe_open(str(path), framework="pt") as f:
        return {k: math.prod(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118  safe_open has keys() but is neither iterable nor a container


def test_tiny_llama_record(tiny_llama, policy, snapshot):
    before = snapshot(tiny_llama)
    record = intake(tiny_llama, policy)
    assert snapshot(tiny_llama) == before

    assert record.path == str(tiny_llama.resolve())
    assert record.architecture == "LlamaForCausalLM"
    assert record.model_type == "llama"
    assert record.params == sum(tensor_numels(tiny_llama / "model.safetensors").values())
    assert record.dtype == "bfloat16"
    assert (record.moe, record.num_experts) == (False, None)
    assert record.model_class == "draft"
    assert record.context_length == 256
    assert record.tie_word_embeddings is False

    sizes = all_files(tiny_llama)
    assert {rel: e.bytes for rel, e in record.files.items()} == sizes
    assert record.bytes == sum(sizes.values())
    for rel, e in record.files.items():  # the source is hashed with BLAKE3 (issue 47), named in each entry
        assert e.scheme == "blake3"
        assert e.sha256 == blake3.blake3((tiny_llama / rel).read_bytes()).hexdigest()
    assert len(record.content_hash) == 64


def test_record_is_frozen_strict_and_round_trips(tiny_llama, policy):
    record = intake(tiny_llama, policy)
    with pytest.raises(ValidationError):
        record.params = 1
    with pytest.raises(ValidationError):
        SourceRecord(**record.model_dump(), unexpected=1)
    assert SourceRecord.model_validate_json(record.model_dump_json()) == record


@pytest.mark.parametrize("fixture", ["tiny_mixtral", "tiny_qwen_moe"])
def test_moe_checkpoints_are_detected(request, policy, fixture):
    checkpoint = request.getfixturevalue(fixture)
    record = intake(checkpoint, policy)
    assert (record.moe, record.num_experts) == (True, 4)
    assert record.model_class == "moe"
    assert record.params == sum(tensor_numels(checkpoint / "model.safetensors").values())


def test_tied_embeddings(tmp_path, policy):
    checkpoint = write_tiny_model(tmp_path / "tied", "llama", tie_word_embeddings=True)
    record = intake(checkpoint, policy)
    assert record.tie_word_embeddings is True
    assert record.params == sum(tensor_numels(checkpoint / "model.safetensors").values())


def test_content_hash_is_stable_and_independent_of_location(tiny_llama, policy, tmp_path):
    first = intake(tiny_llama, policy)
    assert intake(tiny_llama, policy).content_hash == first.content_hash
    moved = Path(shutil.copytree(tiny_llama, tmp_path / "elsewhere" / "copy"))
    assert intake(moved, policy).content_hash == first.content_hash


def _touch_one_byte(path: Path) -> None:
    """Change a file without making it invalid: a trailing newline, or one mantissa bit of a weight."""
    if path.suffix == ".safetensors":
        offset = read_header(path).data_offset
        with open(path, "r+b") as f:
            f.seek(offset)
            byte = f.read(1)[0]
            f.seek(offset)
            f.write(bytes([byte ^ 0x01]))
    else:
        path.write_bytes(path.read_bytes() + b"\n")


def test_content_hash_changes_when_any_file_changes(tiny_llama, policy):
    original = intake(tiny_llama, policy).content_hash
    seen = {original}
    for rel in sorted(all_files(tiny_llama)):
        _touch_one_byte(tiny_llama / rel)
        changed = intake(tiny_llama, policy).content_hash
        assert changed not in seen, f"changing {rel} did not change the content hash"
        seen.add(changed)


def test_content_hash_changes_when_a_file_is_added_or_renamed(tiny_llama, policy):
    original = intake(tiny_llama, policy).content_hash
    (tiny_llama / "README.md").write_text("a model card\n")
    added = intake(tiny_llama, policy).content_hash
    os.rename(tiny_llama / "README.md", tiny_llama / "MODEL_CARD.md")
    renamed = intake(tiny_llama, policy).content_hash
    assert len({original, added, renamed}) == 3


def test_sharded_checkpoint(tiny_llama, policy):
    expected = intake(tiny_llama, policy).params
    tensors = load_file(tiny_llama / "model.safetensors")
    names = sorted(tensors)
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:]), start=1):
        shard = f"model-{i:05d}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, tiny_llama / shard, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, shard))
    (tiny_llama / "model.safetensors").unlink()
    (tiny_llama / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )

    record = intake(tiny_llama, policy)
    assert record.params == expected
    assert {"model-00001-of-00002.safetensors", "model.safetensors.index.json"} <= set(record.files)


def test_symlink_inside_the_checkpoint_is_accepted(tiny_llama, policy):
    (tiny_llama / "extra").mkdir()
    os.symlink("../tokenizer.json", tiny_llama / "extra" / "tokenizer.json")
    os.symlink("extra", tiny_llama / "extra_link")
    record = intake(tiny_llama, policy)
    assert record.files["extra/tokenizer.json"] == record.files["tokenizer.json"]
    assert not any(rel.startswith("extra_link") for rel in record.files)


class RecordingProgress:
    def __init__(self) -> None:
        self.tasks: dict[str, list[float]] = {}

    @contextlib.contextmanager
    def task(self, description: str, total: float | None):
        done = self.tasks.setdefault(description, [total, 0])

        class Handle:
            def advance(self, amount: float = 1) -> None:
                done[1] += amount

        yield Handle()

    def log(self, message: str) -> None:
        pass


def test_progress_covers_hashing_and_scanning(tiny_llama, policy):
    progress = RecordingProgress()
    record = intake(tiny_llama, policy, progress)
    assert len(progress.tasks) == 2
    hashing = next(v for k, v in progress.tasks.items() if "hash" in k)
    scanning = next(v for k, v in progress.tasks.items() if "NaN" in k)
    assert hashing == [record.bytes, record.bytes]
    header = read_header(tiny_llama / "model.safetensors")
    weight_bytes = sum(t.nbytes for t in header.tensors.values())
    assert scanning == [weight_bytes, weight_bytes]
