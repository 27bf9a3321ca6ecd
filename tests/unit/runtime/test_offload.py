"""``quantgate.runtime.offload``: which layers stay on the device under ``--max-memory``, and how much it reads.

The evaluation through the command line, offloaded against resident, is
tests/integration/test_offloaded_eval.py; here the placement itself, on models built in memory.
"""

from __future__ import annotations

import pytest
import torch

from quantgate.runtime import offload
from quantgate.runtime.errors import UsageError
from support.models import tiny_config


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_config("llama", num_hidden_layers=4), dtype=torch.bfloat16)


def _sizes(model) -> tuple[int, int]:
    """(bytes outside the layers, bytes of one layer)."""
    total = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    layer = sum(
        t.numel() * t.element_size()
        for t in (*model.model.layers[0].parameters(), *model.model.layers[0].buffers())
    )
    return total - 4 * layer, layer


def test_a_model_that_fits_is_not_hooked(model):
    fixed, layer = _sizes(model)
    assert offload.plan(model, "cpu", fixed + 4 * layer) is None


def test_layers_fill_the_budget_in_order_and_the_rest_is_offloaded(model):
    fixed, layer = _sizes(model)
    placement = offload.plan(model, "cpu", fixed + 2 * layer + layer // 2)
    assert placement is not None
    assert placement.offloaded == 2 and placement.layers == 4
    assert placement.resident == fixed + 2 * layer
    # embeddings, the final norm and the head stay on the device whatever the budget
    for name in ("model.embed_tokens", "model.norm", "lm_head"):
        assert placement.device_map[name] == "cpu"
    assert [placement.device_map[f"model.layers.{i}"] for i in range(4)] == ["cpu", "cpu", "disk", "disk"]
    assert "2 of 4 decoder layers" in placement.note and "disk" in placement.note


def test_a_budget_below_the_resident_part_names_the_size_that_would_do(model):
    fixed, _ = _sizes(model)
    with pytest.raises(UsageError, match="--max-memory") as caught:
        offload.plan(model, "cpu", fixed - 1)
    assert "embeddings, final norm and head" in caught.value.problem
    assert caught.value.fix.startswith("pass at least")


@pytest.mark.parametrize("value", ["40", "lots", "4XB", "-1GB"])
def test_a_size_without_a_unit_or_a_known_one_is_refused(value):
    with pytest.raises(UsageError, match="--max-memory"):
        offload.budget(value, "cpu")


def test_budget_reads_si_and_binary_units_and_auto_offloads_nothing_on_the_cpu():
    assert offload.budget("40GB", "cpu") == 40_000_000_000
    assert offload.budget("40GiB", "cpu") == 40 * 1024**3
    assert offload.budget(None, "cpu") is None
    assert offload.budget("auto", "cpu") is None  # the host's memory is the CPU's limit already
