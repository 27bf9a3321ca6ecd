"""Sensitivity on tiny models: one number per layer group, replayed prefixes change none of them,
a restored group never makes the artifact further from the source in aggregate, and it is cached."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantgate.calibration import build_set, load_spec
from quantgate.config.gates import load_gates
from quantgate.config.targets import Catalog
from quantgate.intake import intake
from quantgate.repair import sensitivity
from quantgate.repair.units import quantized_units
from support.builds import build_targets

pytestmark = pytest.mark.unit

TEXTS = [" ".join(f"word{i} follows word{i - 1}." for i in range(j, j + 120)) for j in range(0, 600, 120)]


@pytest.fixture(params=["llama", "mixtral"])
def uniform(request, tmp_path, repo_root):
    from support.models import write_tiny_model

    source = write_tiny_model(tmp_path / "source", request.param)
    catalog = Catalog(repo_root)
    record = intake(source, load_gates(repo_root / "gates.yaml", catalog))
    calibration = build_set(load_spec(repo_root / "calibration_sets" / "default.yaml"))
    build_targets(record, ["blackwell-nvfp4"], tmp_path / "artifacts", catalog, calibration)
    return record, tmp_path / "artifacts" / "blackwell-nvfp4", request.param


@pytest.mark.heavy
def test_replaying_earlier_layers_gives_the_same_scores_as_full_passes(uniform, tmp_path):
    record, artifact, kind = uniform
    units = quantized_units(artifact)
    if kind == "mixtral":
        assert any(u.name.endswith(".experts") for u in units)  # an MoE layer's experts are one group
    fast = sensitivity.measure(artifact, Path(record.path), record.content_hash, units, TEXTS, None)
    full = sensitivity.measure(
        artifact, Path(record.path), record.content_hash, units, TEXTS, None, replay=False
    )
    assert fast.scores == full.scores
    assert set(fast.scores) == {u.name for u in units}
    assert fast.kld_uniform > 0
    assert sum(fast.scores.values()) > 0  # restoring groups brings the artifact closer overall
    ranked = fast.ranked(units)
    assert [fast.scores[u.name] for u in ranked] == sorted(fast.scores.values(), reverse=True)


@pytest.mark.heavy
@pytest.mark.parametrize("uniform", ["llama"], indirect=True)
def test_a_second_measurement_comes_from_the_cache(uniform, tmp_path):
    record, artifact, _ = uniform
    units = quantized_units(artifact)
    first = sensitivity.measure(
        artifact, Path(record.path), record.content_hash, units, TEXTS, tmp_path / "c"
    )
    (cached,) = (tmp_path / "c" / "repair").glob("sensitivity-*.json")
    again = sensitivity.measure(
        artifact, Path(record.path), record.content_hash, units, TEXTS, tmp_path / "c"
    )
    assert again == first
    other = sensitivity.measure(
        artifact, Path(record.path), record.content_hash, units, TEXTS[:2], tmp_path / "c"
    )
    assert other.texts_sha256 != first.texts_sha256  # other texts: measured again
    assert len(list((tmp_path / "c" / "repair").glob("sensitivity-*.json"))) == 2
    assert cached.exists()


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_on_the_gpu_sensitivity_has_its_own_cache_entry_and_ranks_like_the_cpu(uniform, tmp_path):
    """Issue 27 item 1: repair measures on --device; a GPU's scores are never served as the CPU's."""
    record, artifact, _ = uniform
    units = quantized_units(artifact)
    args = (artifact, Path(record.path), record.content_hash, units, TEXTS, tmp_path / "c")
    cpu = sensitivity.measure(*args)
    gpu = sensitivity.measure(*args, device="cuda")
    assert len(list((tmp_path / "c" / "repair").glob("sensitivity-*.json"))) == 2
    assert set(gpu.scores) == set(cpu.scores)
    assert gpu.ranked(units)[0] == cpu.ranked(units)[0]
