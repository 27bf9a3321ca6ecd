"""gates.yaml is one strict model for every command: model classes and tenants alike, read once."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantgate.config.gates import Gates, load_gates, resolve_targets
from quantgate.runtime.errors import ConfigFileError

pytestmark = pytest.mark.unit


def _copy(repo_root: Path, tmp_path: Path, change=lambda text: text) -> Path:
    path = tmp_path / "gates.yaml"
    path.write_text(change((repo_root / "gates.yaml").read_text()))
    return path


def _line(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def test_model_classes_are_as_strict_as_tenants(repo_root, tmp_path, catalog):
    # an unknown key anywhere is refused: the build used to read this file leniently
    path = _copy(repo_root, tmp_path, lambda t: t.replace("version: 1\n", "version: 1\ntenats: {}\n"))
    with pytest.raises(ConfigFileError, match=r"unknown key 'tenats' \(did you mean 'tenants'\?\)") as err:
        load_gates(path, catalog)
    assert f"{path}:{_line(path, 'tenats')}:" in str(err.value)
    path = _copy(
        repo_root,
        tmp_path,
        lambda t: t.replace("      required: [draft-int4]", "      required: [draft-int5]"),
    )
    with pytest.raises(
        ConfigFileError, match=r"unknown target 'draft-int5' \(did you mean 'draft-int4'\?\)"
    ) as err:
        load_gates(path, catalog)
    assert f"{path}:{_line(path, 'draft-int5')}:" in str(err.value)


def test_validated_once_per_process_per_content(repo_root, tmp_path, catalog):
    path = _copy(repo_root, tmp_path)
    first = load_gates(path, catalog)
    assert load_gates(path, catalog) is first  # the same bytes: not validated again
    path.write_text(path.read_text().replace("max_delta_pct: 10}", "max_delta_pct: 12}"))
    changed = load_gates(path, catalog)
    assert changed is not first and changed.tenants["batch"].floors[0].max_delta_pct == 12
    path.write_text(path.read_text().replace("metric: kld_mean, max: 0.1}", "metric: kld_maen, max: 0.1}"))
    with pytest.raises(ConfigFileError, match="did you mean 'kld_mean'"):  # a changed file is checked again
        load_gates(path, catalog)


def test_classification_and_targets(repo_root, catalog):
    gates = load_gates(repo_root / "gates.yaml", catalog)
    assert gates.classify(moe=True, params=400_000_000_000, context=None) == "large-moe"
    assert gates.classify(moe=True, params=47_000_000_000, context=None) == "moe"
    assert gates.classify(moe=False, params=8_000_000_000, context=131072) == "dense-reasoner"
    assert resolve_targets(gates, "moe", None, catalog) == ["hopper-fp8", "rocm-cdna3-fp8", "blackwell-nvfp4"]
    only_moe = Gates.model_validate(
        {
            "model_classes": {"moe": gates.model_classes["moe"].model_dump()},
            "tenants": gates.model_dump()["tenants"],
        }
    )
    with pytest.raises(ConfigFileError, match="no model class matches this checkpoint"):
        only_moe.classify(moe=False, params=1, context=None)
