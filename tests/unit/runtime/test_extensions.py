"""Extension from outside the package (issue 26 item 7): a build engine, a suite kind and a numerics
format, each written in a module of its own that quantgate's tree does not hold and named only by
its distribution's entry points, are found by name the way quantgate's own are (nothing imports
the plugin by hand), and a recipe naming the outside engine is valid configuration. A plugin that
breaks its extension point's protocol is refused by name when it is loaded."""

from __future__ import annotations

import shutil
import sys

import pytest
import torch

from quantgate import declarations
from quantgate.config import Catalog
from quantgate.declarations import SUITE_KINDS
from quantgate.evaluate import KINDS
from quantgate.numerics import kv_cache_format, kv_cache_formats
from quantgate.numerics.formats import ACTIVATION_FORMATS, KV_CACHE_FORMATS
from quantgate.numerics.weights import WEIGHT_FORMATS
from quantgate.quantize.engines import ENGINES, engine_class
from quantgate.runtime.errors import ConfigFileError

pytestmark = pytest.mark.unit

PLUGIN = '''
"""Engines, suite kinds and KV cache formats from outside quantgate; the Broken ones and
int4_kv break their extension point's protocol."""
import torch

from quantgate.evaluate.suites import SuiteKind
from quantgate.numerics import DecodedWeight, register_kv_cache, register_weights


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


@register_weights("acme-int3", disk_format="pack-quantized", required={"weight_packed", "weight_scale"})
def int3_weights(tensors):
    return DecodedWeight(values=tensors["weight_packed"].float(), scales=tensors["weight_scale"])


class BrokenEngine:  # no build
    def preflight(self, source, recipe):
        pass


class BrokenKind:  # a suite kind must derive from SuiteKind
    def score(self, ctx, model, reference):
        raise NotImplementedError


def int4_kv(x, scale):  # not registered: a bare function is no KV cache format
    return x
'''

ENTRY_POINTS = """
[quantgate.engines]
acme.int3 = acme_plugin:Int3Engine
acme.broken = acme_plugin:BrokenEngine

[quantgate.suite_kinds]
acme_rubric = acme_plugin:RubricKind
acme_broken = acme_plugin:BrokenKind

[quantgate.kv_cache_formats]
acme-int8 = acme_plugin:int8_kv
acme-int4 = acme_plugin:int4_kv

[quantgate.weight_formats]
acme-int3 = acme_plugin:int3_weights
"""


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
    for registry in (
        ENGINES,
        SUITE_KINDS,
        KINDS,
        KV_CACHE_FORMATS,
        WEIGHT_FORMATS,
    ):  # forgotten after the test
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
    """One class is the kind's declaration (configuration's registry) and its runner (evaluation's)."""
    assert "acme_rubric" in SUITE_KINDS.names() and "acme_rubric" in KINDS.names()
    assert SUITE_KINDS.get("acme_rubric") is KINDS.get("acme_rubric")
    assert KINDS.get("acme_rubric").__name__ == "RubricKind"


def test_a_numerics_format_from_outside_is_found_by_name_without_importing_its_module(installed):
    assert "acme-int8" in kv_cache_formats()
    assert "acme_plugin" not in sys.modules  # its name came from the entry point alone
    fmt = kv_cache_format("acme-int8")
    assert fmt.name == "acme-int8" and "acme_plugin" in sys.modules
    assert fmt.quantize(torch.tensor([1.26, 300.0]), 0.5).tolist() == [1.5, 63.5]


def test_a_target_selects_an_outside_weight_format_by_name_and_a_typo_is_refused(
    installed, tmp_path, repo_root
):
    """A new format is one module: a target's numerics name it, with no edit to quantgate."""
    project = tmp_path / "project"
    for folder in ("targets", "recipes"):
        shutil.copytree(repo_root / folder, project / folder)
    text = (repo_root / "targets" / "draft-int4.yaml").read_text()
    (project / "targets" / "acme.yaml").write_text(
        text.replace("name: draft-int4", "name: acme").replace("weights: int4", "weights: acme-int3")
    )
    assert Catalog(project).target("acme").numerics.weights == "acme-int3"
    (project / "targets" / "typo.yaml").write_text(
        text.replace("name: draft-int4", "name: typo").replace("weights: int4", "weights: acme-int33")
    )
    with pytest.raises(ConfigFileError, match=r"unknown weight format 'acme-int33'.*acme-int3"):
        Catalog(project).target("typo")


def test_a_plugin_that_breaks_its_protocol_is_refused_by_name(installed):
    with pytest.raises(ConfigFileError) as info:
        engine_class("acme.broken")
    message = str(info.value)
    assert "engine 'acme.broken'" in message and "acme_plugin:BrokenEngine" in message
    assert "does not implement build(), which quantgate.quantize.engines.base.Engine requires" in message
    assert "acme.broken" not in ENGINES._entries
    with pytest.raises(
        ConfigFileError, match="suite kind 'acme_broken' is the class BrokenKind, not a subclass of"
    ):
        SUITE_KINDS.get("acme_broken")
    with pytest.raises(
        ConfigFileError, match="KV cache format 'acme-int4' is a function, not a KVCacheFormat"
    ):
        kv_cache_format("acme-int4")


def test_an_engine_registered_by_decorator_is_checked_too(installed):
    class Half:
        def build(self, job): ...

    with pytest.raises(ConfigFileError, match="engine 'acme.half' does not implement preflight()"):
        ENGINES.register("acme.half")(Half)


def test_quantgate_s_own_formats_are_declared_by_their_decorators_like_its_engines():
    for registry, module in [
        (WEIGHT_FORMATS, "weights"),
        (ACTIVATION_FORMATS, "formats"),
        (KV_CACHE_FORMATS, "formats"),
    ]:
        assert registry.names() and all(
            registry._lazy[name] == f"quantgate.numerics.{module}" for name in registry.names()
        )
        assert all(registry.get(name).name == name for name in registry.names())


@pytest.mark.parametrize(
    "declared, registry",
    [
        (declarations.ENGINES, ENGINES),
        (declarations.WEIGHT_FORMATS, WEIGHT_FORMATS),
        (declarations.ACTIVATION_FORMATS, ACTIVATION_FORMATS),
        (declarations.KV_CACHE_FORMATS, KV_CACHE_FORMATS),
    ],
    ids=["engines", "weight formats", "activation formats", "KV cache formats"],
)
def test_configuration_s_names_are_the_stages_own(declared, registry):
    """Configuration checks a recipe's engine and a target's formats against
    ``quantgate.declarations`` without importing a stage: the names there are the stages' own."""
    registry._own()
    assert sorted(declared.builtin) == sorted(registry._lazy)


def test_suite_kinds_declared_are_the_kinds_evaluation_runs():
    """Every declaration has its runner, and every runner derives from its kind's declaration."""
    assert SUITE_KINDS.names() == KINDS.names()
    for name in KINDS.names():
        assert issubclass(KINDS.get(name), SUITE_KINDS.get(name)), name
