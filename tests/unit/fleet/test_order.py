"""Load order (issue 28 item 4): the files a serving engine reads first are fetched first."""

from __future__ import annotations

import json

import pytest

from quantgate.fleet.order import load_order
from quantgate.fleet.torrent import MAX_PIECE, MIN_PIECE, piece_size

pytestmark = pytest.mark.unit


def test_manifest_then_configs_then_the_index_then_shards_as_the_index_names_them(tmp_path):
    index = {
        "weight_map": {
            "lm_head.weight": "model-00002-of-00002.safetensors",
            "embed": "model-00001-of-00002.safetensors",
        }
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    files = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "config.json",
        "manifest.json",
        "extra.bin",
    ]
    assert load_order(files, tmp_path) == [
        "manifest.json",
        "config.json",
        "tokenizer.json",
        "model.safetensors.index.json",
        "model-00002-of-00002.safetensors",  # the index names it first
        "model-00001-of-00002.safetensors",
        "extra.bin",
    ]
    # without the index on disk yet: shards by name (model-00001 first)
    assert load_order(files)[4:6] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


@pytest.mark.parametrize(
    ("total", "expected"), [(1, MIN_PIECE), (10**9, MIN_PIECE), (200 * 10**9, MAX_PIECE)]
)
def test_piece_size_is_a_power_of_two_within_bounds(total, expected):
    assert piece_size(total) == expected
