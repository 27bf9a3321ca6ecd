"""Extension from outside the package (issue 26 item 7): a build engine, a suite kind and a numerics
format, each written in a module of its own that quantgate's tree does not hold, are found by name
the way quantgate's own are, and a recipe naming the outside engine is valid configuration."""

from __future__ import annotations

import importlib
import shutil
import sys

import pytest

from quantgate.config import Catalog
from quantgate.extensions import ENGINES, SUITE_KINDS
from quantgate.numerics import kv_cache_format
from quantgate.numerics.formats import KV_CACHES
from quantgate.quantize.engines import engine_class

pytestmark = pytest.mark.unit

PLUGIN = '''
"""An engine, a suite kind and a KV cache format from outside quantgate."""
import torch

from quantgate.evaluate.suites import SuiteKind
from quantgate.numerics import register_kv_cache


class Int3Engine:
    def preflight(self, source, recipe):
        pass

    def build(self, job):
        raise NotImplementedError


class RubricKind(SuiteKind):
    spec_model = None

    def reference(self, ctx, source):
        raise NotImplementedError

    def score(self, ctx, model, reference):
        raise NotImplementedError

    def metrics(self):
        return {}

    def columns(self, sample):
        return {}


@register_kv_cache("acme-int8")
def int8_kv(x, scale):
    return torch.round(x / scale).clamp(-128, 127) * scale
'''

ENTRY_POINTS = "[quantgate.engines]\nacme.int3 = acme_plugin:Int3Engine\n\n[quantgate.suite_kinds]\nacme_rubric = acme_plugin:RubricKind\n"


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """acme_plugin as an installed distribution would put it on sys.path, with its entry points."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "acme_plugin.py").write_text(PLUGIN)
    info = site / "acme_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(site))
    for registry in (ENGINES, SUITE_KINDS, KV_CACHES):  # forgotten after the test
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))
    sys.modules.pop("acme_plugin", None)  # each test imports it afresh, registering anew
    yield
    sys.modules.pop("acme_plugin", None)


def test_an_engine_from_outside_is_found_by_name_and_a_recipe_may_name_it(installed, tmp_path, repo_root):
    assert "acme.int3" in ENGINES.names()
    assert engine_class("acme.int3").__name__ == "Int3Engine"
    shutil.copytree(repo_root / "recipes", tmp_path / "project" / "recipes")
    recipe = tmp_path / "project" / "recipes" / "int3.yaml"
    text = (repo_root / "recipes" / "fp8-dynamic.yaml").read_text()
    recipe.write_text(
        text.replace("name: fp8-dynamic", "name: int3").replace(
            "engine: quantgate.stream_fp8", "engine: acme.int3"
        )
    )
    assert Catalog(tmp_path / "project").recipe("int3").engine == "acme.int3"


def test_a_suite_kind_from_outside_is_found_by_name(installed):
    assert "acme_rubric" in SUITE_KINDS.names()
    assert SUITE_KINDS.get("acme_rubric").__name__ == "RubricKind"


def test_a_numerics_format_from_outside_registers_on_import(installed):
    importlib.import_module("acme_plugin")
    assert kv_cache_format("acme-int8").name == "acme-int8"
