"""The engine registry is the one list of engines: recipes are validated against it, and a new
engine is found from its module's ``@register`` alone, without importing any engine."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from quantgate.config.targets import Catalog
from quantgate.quantize.engines import ENGINES, declared_engines, engine_class
from quantgate.runtime.errors import ConfigFileError

pytestmark = pytest.mark.unit

NEW_ENGINE = """
from quantgate.quantize.engines import register


@register("acme.int3")
class Int3:
    def preflight(self, source, recipe): ...

    def build(self, job): ...
"""


def test_every_declared_engine_registers_the_name_its_module_declares():
    assert set(ENGINES.names()) >= {
        "llmcompressor.model_free",
        "llmcompressor.oneshot",
        "modelopt",
        "quantgate.stream_fp8",
    }
    for name in ENGINES.names():
        cls = engine_class(name)
        assert callable(getattr(cls, "preflight", None)) and callable(getattr(cls, "build", None)), name


def test_a_new_engine_module_is_found_by_its_decorator_alone(tmp_path):
    (tmp_path / "int3.py").write_text(NEW_ENGINE)
    (tmp_path / "helpers.py").write_text("def register_later(x):\n    return x\n")
    assert declared_engines(tmp_path, "acme.engines") == {"acme.int3": "acme.engines.int3"}
    (tmp_path / "int3_copy.py").write_text(NEW_ENGINE)
    with pytest.raises(ValueError, match="'acme.int3' is registered in both"):
        declared_engines(tmp_path, "acme.engines")


def test_every_shipped_recipe_names_a_registered_engine(catalog):
    for name in sorted(p.stem for p in catalog.recipes_dir.glob("*.yaml")):
        assert catalog.recipe(name).engine in ENGINES.names()


def test_an_unknown_engine_names_the_line_and_the_nearest_engine(tmp_path, repo_root):
    shutil.copytree(repo_root / "recipes", tmp_path / "recipes")
    path = tmp_path / "recipes" / "fp8-dynamic.yaml"
    lines = path.read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if text.startswith("engine:"))
    path.write_text(path.read_text().replace("engine: quantgate.stream_fp8", "engine: quantgate.stream_fp9"))
    with pytest.raises(ConfigFileError) as caught:
        Catalog(tmp_path).recipe("fp8-dynamic")
    assert f"{path}:{line}" in str(caught.value)
    assert "unknown engine 'quantgate.stream_fp9'" in str(caught.value)
    assert "did you mean 'quantgate.stream_fp8'?" in str(caught.value)


def test_validating_a_recipe_imports_no_engine_module(repo_root):
    code = (
        "import sys; from quantgate.config.targets import Catalog; "
        f"Catalog({str(repo_root)!r}).recipe('fp8-dynamic'); "
        "print(sorted(m for m in sys.modules if m.startswith('quantgate.quantize.engines.')))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]"
