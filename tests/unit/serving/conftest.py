"""The ``build`` fixture: a valid synthetic artifact, optionally edited to break one rule."""

from __future__ import annotations

import pytest
from serving_artifacts import model_config, model_tensors, quant_config, write_artifact


@pytest.fixture
def build(tmp_path):
    """``build(kind, edit=..., **dims) -> dir``: a valid artifact of ``kind``, ``edit(cfg, tensors)`` applied."""
    counter = iter(range(1000))

    def make(kind: str, *, group: int = 64, bits: int = 4, quant: dict | None = None, edit=None, **dims):
        ignore = ("lm_head", r"re:.*mlp\.gate$") if dims.get("experts") else ("lm_head",)
        if dims.get("mla") is not None and kind == "nvfp4":
            ignore = (*ignore, r"re:.*\.kv_b_proj$")  # as recipes/nvfp4.yaml
        cfg = model_config(quant=quant or quant_config(kind, group=group, bits=bits, ignore=ignore), **dims)
        tensors = model_tensors(cfg, kind, group=group, bits=bits)
        if edit is not None:
            edit(cfg, tensors)
        return write_artifact(tmp_path / f"artifact-{next(counter)}", cfg, tensors)

    return make
