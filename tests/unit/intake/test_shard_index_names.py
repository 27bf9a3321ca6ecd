"""A shard index names its files with safe_path's one check (issue 26 item 8): what intake accepts
as a shard name is what a manifest, a store listing or an S3 key accepts."""

from __future__ import annotations

import json

import pytest

from quantgate.intake.weights import _weight_map
from quantgate.runtime.errors import MissingShardError

pytestmark = pytest.mark.unit

INDEX = "model.safetensors.index.json"


def _index(tmp_path, shard):
    (tmp_path / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": {"lm_head.weight": shard}}))
    return tmp_path


@pytest.mark.parametrize(
    "shard",
    [
        "../outside.safetensors",
        "/abs.safetensors",
        "a\\b.safetensors",
        "./m.safetensors",
        "m\x01.safetensors",
    ],
)
def test_a_shard_name_safe_path_refuses_is_refused(tmp_path, shard):
    with pytest.raises(MissingShardError, match="not a .safetensors file in the checkpoint"):
        _weight_map(_index(tmp_path, shard), INDEX)


@pytest.mark.parametrize("shard", ["model-00001-of-00002.safetensors", "sub/model.safetensors"])
def test_an_ordinary_shard_name_is_read(tmp_path, shard):
    assert _weight_map(_index(tmp_path, shard), INDEX) == {"lm_head.weight": shard}
