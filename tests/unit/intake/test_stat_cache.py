"""Intake's stat cache: unchanged files are neither scanned nor hashed twice, changed ones always are."""

from __future__ import annotations

import contextlib
import os

import pytest
from safetensors.torch import load_file, save_file

from quantgate.intake import intake
from quantgate.runtime.errors import NonFiniteWeightsError

pytestmark = pytest.mark.unit


class BytesRead:
    """A Progress that records how many bytes each task announced it would read."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}

    @contextlib.contextmanager
    def task(self, description: str, total: float | None):
        self.totals[description] = total or 0

        class _Handle:
            def advance(self, amount: float = 1) -> None:
                pass

        yield _Handle()

    def log(self, message: str) -> None:
        pass


def _intake(path, policy, cache):
    progress = BytesRead()
    record = intake(path, policy, progress, cache=cache)
    return record, progress.totals


def test_second_intake_reads_no_weights_and_gives_the_same_record(tiny_llama, policy, tmp_path):
    first, read_first = _intake(tiny_llama, policy, tmp_path / "intake")
    again, read_again = _intake(tiny_llama, policy, tmp_path / "intake")
    assert read_first["hashing checkpoint"] > 0 and read_first["scanning weights for NaN/Inf"] > 0
    assert read_again == {"hashing checkpoint": 0, "scanning weights for NaN/Inf": 0}
    assert again == first


def test_a_file_rewritten_in_place_is_scanned_again_even_with_its_mtime_set_back(
    tiny_llama, policy, tmp_path
):
    cache = tmp_path / "intake"
    first, _ = _intake(tiny_llama, policy, cache)
    path = tiny_llama / "model.safetensors"
    st = path.stat()
    tensors = load_file(path)
    tensors["model.layers.1.mlp.down_proj.weight"][3, 5] = float("nan")  # same size, same names
    save_file(tensors, path, metadata={"format": "pt"})
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    with pytest.raises(NonFiniteWeightsError, match="down_proj"):
        _intake(tiny_llama, policy, cache)

    tensors["model.layers.1.mlp.down_proj.weight"][3, 5] = 0.5
    save_file(tensors, path, metadata={"format": "pt"})
    changed, read = _intake(tiny_llama, policy, cache)
    assert changed.content_hash != first.content_hash
    assert read["hashing checkpoint"] == path.stat().st_size  # only the rewritten file


def test_a_damaged_or_foreign_cache_is_a_miss_not_an_error(tiny_llama, policy, tmp_path):
    cache = tmp_path / "intake"
    first, _ = _intake(tiny_llama, policy, cache)
    (saved,) = cache.iterdir()
    saved.write_text("{not json")
    again, read = _intake(tiny_llama, policy, cache)
    assert again == first and read["hashing checkpoint"] > 0
