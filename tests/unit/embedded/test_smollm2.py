"""The embedded default's conversion writes the same bytes whatever the environment says (issue 27
item 4): the source's content hash, and every build and reference key, must not follow
HF_HUB_OFFLINE."""

from __future__ import annotations

import hashlib
from pathlib import Path

import huggingface_hub.constants
import pytest
from transformers import AutoTokenizer

from quantgate.embedded.smollm2 import save_tokenizer
from support.models import write_tiny_tokenizer


def _digest(directory: Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(directory.iterdir())}


def _load_and_save(source: Path, out: Path, offline: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # transformers asks huggingface_hub.is_offline_mode(), which reads this constant (set from
    # HF_HUB_OFFLINE at import)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", offline)
    tokenizer = AutoTokenizer.from_pretrained(source)
    assert tokenizer.init_kwargs.get("local_files_only") is offline  # what leaked before the fix
    out.mkdir()
    save_tokenizer(tokenizer, out)


@pytest.mark.unit
def test_tokenizer_files_do_not_follow_hf_hub_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    source = tmp_path / "source"
    write_tiny_tokenizer(source)
    _load_and_save(source, tmp_path / "online", False, monkeypatch)
    _load_and_save(source, tmp_path / "offline", True, monkeypatch)
    online, offline = _digest(tmp_path / "online"), _digest(tmp_path / "offline")
    assert "tokenizer_config.json" in online
    assert online == offline
    assert "local_files_only" not in (tmp_path / "offline" / "tokenizer_config.json").read_text()


@pytest.mark.unit
@pytest.mark.heavy
def test_the_gguf_file_is_parsed_once_and_read_the_same():
    """The conversion shares one ``GGUFReader`` for every read transformers makes of the file (five
    parses before, 33 s of the README main job's cold start); what transformers reads through the
    shared reader is what it reads through a fresh one, and the patch is gone after the block."""
    import gguf
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from quantgate.embedded.smollm2 import gguf_parsed_once, gguf_path

    path = gguf_path()
    fresh = load_gguf_checkpoint(path, return_tensors=False)
    made = gguf.GGUFReader
    with gguf_parsed_once() as readers:
        first = load_gguf_checkpoint(path, return_tensors=False)
        second = load_gguf_checkpoint(str(path), return_tensors=False)
        assert len(readers) == 1  # two reads, one parse
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 30) is gguf.get_tensor_name_map(
            gguf.MODEL_ARCH.LLAMA, 30
        )
    assert gguf.GGUFReader is made
    assert first["config"] == second["config"] == fresh["config"]
    assert first["tokenizer"] == fresh["tokenizer"]
    assert first["tokenizer_config"] == fresh["tokenizer_config"]
