"""KV cache from the policy: FP8 scales and scheme exactly where the class (or --targets) says FP8."""

from __future__ import annotations

import gc
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import save_file

from quantgate.calibration import build_set, load_spec
from quantgate.config.gates import load_gates
from quantgate.config.targets import KVCache
from quantgate.intake import intake
from quantgate.numerics import load_for_eval
from quantgate.numerics.kvcache import ObserveKV, attention_modules, install_kv_hooks
from quantgate.quantize import kv_calibration as kvc
from quantgate.runtime.errors import CalibrationError
from quantgate.serving.check import check_artifact
from support.builds import build_targets
from support.models import write_large_llama

pytestmark = pytest.mark.unit

ALL = ["hopper-fp8", "rocm-cdna3-fp8", "blackwell-nvfp4", "draft-int4"]


@pytest.fixture(scope="module")
def calibration(repo_root):
    return build_set(load_spec(repo_root / "calibration_sets" / "default.yaml"))


@pytest.fixture(scope="module")
def gates(repo_root, catalog):
    return load_gates(repo_root / "gates.yaml", catalog)


def _scales(artifact: Path) -> dict[str, torch.Tensor]:
    out = {}
    for shard in artifact.glob("*.safetensors"):
        with safe_open(shard, "pt") as f:
            out |= {k: f.get_tensor(k) for k in f.keys() if k.endswith(("k_scale", "v_scale"))}  # noqa: SIM118
    return out


def _kv_scheme(artifact: Path):
    return json.loads((artifact / "config.json").read_text())["quantization_config"].get("kv_cache_scheme")


@pytest.fixture(scope="module")
def overridden(tmp_path_factory, _tiny_models, gates, catalog, calibration):
    """The four targets under ``--targets``: each target's own kv_cache decides."""
    record = intake(_tiny_models["llama"], gates)
    decisions = kvc.kv_decisions(gates, record.model_class, ALL, [catalog.target(n) for n in ALL])
    out = tmp_path_factory.mktemp("kv-override")
    return record, {
        r.target: r for r in build_targets(record, ALL, out, catalog, calibration, kv_cache=decisions)
    }


@pytest.mark.heavy
def test_four_targets_under_targets_get_fp8_kv_exactly_where_their_yaml_says(overridden, catalog):
    _, results = overridden
    layers = [f"model.layers.{i}.self_attn.{p}" for i in range(2) for p in ("k_scale", "v_scale")]
    for target, result in results.items():
        fp8 = catalog.target(target).kv_cache == KVCache.FP8_E4M3
        assert fp8 == (target != "draft-int4")
        assert result.manifest.kv_cache == catalog.target(target).kv_cache
        scales = _scales(result.path)
        if fp8:
            # as llm-compressor writes them: config entry, one [1]-shaped scale per layer in the model's dtype
            assert _kv_scheme(result.path) == kvc.kv_cache_scheme_config()
            assert sorted(scales) == layers
            assert all(
                t.shape == (1,) and t.dtype == torch.bfloat16 and float(t) > 0 for t in scales.values()
            )
            assert result.manifest.calibration is not None  # data-free hopper/rocm read the set too
        else:
            assert _kv_scheme(result.path) is None and scales == {}
        # the serving check accepts every artifact, and says what vLLM runs the KV cache in
        table = check_artifact(result.path, catalog.target(target))
        assert table.loadable_tp and table.kv_cache.startswith("fp8" if fp8 else "bfloat16")
        assert result.manifest.serving == table


def test_llm_compressor_and_the_data_free_pass_declare_the_same_scheme(overridden):
    _, results = overridden
    # blackwell-nvfp4: llm-compressor's own kv_cache_scheme; hopper-fp8: written by kv_calibration
    assert _kv_scheme(results["blackwell-nvfp4"].path) == _kv_scheme(results["hopper-fp8"].path)
    recipe = yaml.safe_load((results["blackwell-nvfp4"].path / "recipe.yaml").read_text())
    assert "kv_cache_scheme" in json.dumps(recipe)


@pytest.mark.heavy
def test_a_draft_through_its_class_declares_no_kv_anywhere(
    _tiny_models, gates, catalog, calibration, tmp_path
):
    record = intake(_tiny_models["llama"], gates)
    assert record.model_class == "draft"
    names = [*gates.model_classes["draft"].targets.required, *gates.model_classes["draft"].targets.optional]
    decisions = kvc.kv_decisions(gates, "draft", None, [catalog.target(n) for n in names])
    assert decisions == {"draft-int4": KVCache.BF16}
    (result,) = build_targets(record, names, tmp_path / "out", catalog, calibration, kv_cache=decisions)
    assert _kv_scheme(result.path) is None and _scales(result.path) == {}


def test_the_class_wins_over_a_target_yaml_that_disagrees(_tiny_models, repo_root, catalog, tmp_path):
    """A class whose policy is bf16 gets no FP8 KV even on a target whose YAML says FP8, and its
    data-free build then reads no calibration data."""
    text = (repo_root / "gates.yaml").read_text()
    gates_text = text.replace("      required: [draft-int4]", "      required: [draft-int4, hopper-fp8]", 1)
    assert gates_text != text
    (tmp_path / "gates.yaml").write_text(gates_text)
    gates = load_gates(tmp_path / "gates.yaml", catalog)
    record = intake(_tiny_models["llama"], gates)
    decisions = kvc.kv_decisions(gates, record.model_class, None, [catalog.target("hopper-fp8")])
    assert decisions == {"hopper-fp8": KVCache.BF16}
    (result,) = build_targets(record, ["hopper-fp8"], tmp_path / "out", catalog, None, kv_cache=decisions)
    assert result.manifest.kv_cache == KVCache.BF16 and result.manifest.calibration is None
    assert _kv_scheme(result.path) is None and _scales(result.path) == {}
    assert load_for_eval(result.path).numerics.kv_cache == "bf16"


def test_fp8_kv_without_a_calibration_set_is_refused_before_anything_is_written(
    tiny_llama, gates, catalog, tmp_path
):
    record = intake(tiny_llama, gates)
    with pytest.raises(
        CalibrationError, match="hopper-fp8 needs the calibration set for its FP8 KV cache scales"
    ):
        build_targets(record, ["hopper-fp8"], tmp_path / "out", catalog, None)
    assert not (tmp_path / "out").exists()


@pytest.mark.heavy
def test_the_decision_and_the_calibration_set_are_in_the_data_free_build_key(
    overridden, catalog, calibration, tmp_path
):
    record, results = overridden
    fp8 = results["hopper-fp8"].manifest.build_key
    (bf16,) = build_targets(
        record, ["hopper-fp8"], tmp_path / "bf16", catalog, None, kv_cache={"hopper-fp8": KVCache.BF16}
    )
    assert bf16.manifest.build_key != fp8
    other = calibration.model_copy(update={"sha256": "0" * 64})
    (again,) = build_targets(
        record, ["hopper-fp8"], tmp_path / "other", catalog, other, kv_cache={"hopper-fp8": KVCache.FP8_E4M3}
    )
    assert again.manifest.build_key != fp8 and again.manifest.calibration.sha256 == "0" * 64
    # the weights are the same bytes whatever the KV decision: only the KV tensors and config entry differ
    with (
        safe_open(bf16.path / "model.safetensors", "pt") as f,
        safe_open(results["hopper-fp8"].path / "model.safetensors", "pt") as g,
    ):
        names = set(f.keys())
        assert set(g.keys()) - names == set(_scales(results["hopper-fp8"].path))
        for name in names:
            assert torch.equal(f.get_tensor(name).view(torch.uint8), g.get_tensor(name).view(torch.uint8))
    ours = json.loads((bf16.path / "config.json").read_text())
    theirs = json.loads((results["hopper-fp8"].path / "config.json").read_text())
    assert ours["quantization_config"].pop("kv_cache_scheme", None) is None
    assert theirs["quantization_config"].pop("kv_cache_scheme") == kvc.kv_cache_scheme_config()
    assert ours == theirs


@pytest.mark.heavy
def test_stored_scale_is_absmax_over_448_of_the_served_numerics(overridden, catalog, calibration, tmp_path):
    """The streamed layer-by-layer pass (float64, canonical) agrees with one whole-model pass of
    load_for_eval (W8A8 in bf16, no KV emulation) to that pass's rounding, and the stored scale is
    the float64 absmax / 448 rounded to bf16."""
    _, results = overridden
    hopper = results["hopper-fp8"].path
    loaded = load_for_eval(hopper, kv_cache=False)
    observers = {n: ObserveKV() for n in attention_modules(loaded.model)}
    install_kv_hooks(loaded.model, observers)
    tokenizer = loaded.tokenizer
    kv_pass = catalog.recipe("fp8-dynamic").calibration  # how many samples, how long
    with torch.inference_mode():
        for text in calibration.texts()[: kv_pass.num_samples]:
            ids = tokenizer(text, truncation=True, max_length=kv_pass.max_seq_length, return_tensors="pt")[
                "input_ids"
            ]
            loaded.model(ids)
    stored = _scales(hopper)
    kv_pass = kvc.calibrate(
        hopper, catalog.target("hopper-fp8"), calibration, kv_pass.num_samples, kv_pass.max_seq_length
    )
    assert kv_pass.arithmetic.canonical, kv_pass.arithmetic.notes
    for name, obs in observers.items():
        k, v = kv_pass.absmax[name]
        assert float(obs.k_absmax) > 0
        assert k == pytest.approx(float(obs.k_absmax), rel=0.06)  # bf16 rounding, FP8-amplified
        assert v == pytest.approx(float(obs.v_absmax), rel=0.06)
        assert torch.equal(stored[f"{name}.k_scale"], (torch.tensor([k]) / 448).bfloat16())
        assert torch.equal(stored[f"{name}.v_scale"], (torch.tensor([v]) / 448).bfloat16())
    manifest = json.loads((hopper / "manifest.json").read_text())
    assert manifest["build"]["kv_calibration"] == {"by": "quantgate", "canonical": True, "notes": []}
    assert manifest["build"]["device"] == "cpu"
    # rocm-cdna3-fp8 links hopper-fp8's bytes: its manifest says how those scales were computed too
    rocm = json.loads((results["rocm-cdna3-fp8"].path / "manifest.json").read_text())["build"]
    assert (
        rocm["linked_from"] == "hopper-fp8" and rocm["kv_calibration"] == manifest["build"]["kv_calibration"]
    )


def _reordered_linear(x, weight, bias=None):
    """F.linear with the inner sum split in two halves added afterwards: another BLAS kernel's order."""
    half = x.shape[-1] // 2
    y = torch.nn.functional.linear(x[..., :half], weight[:, :half]) + torch.nn.functional.linear(
        x[..., half:], weight[:, half:]
    )
    return y if bias is None else y + bias


@pytest.fixture(scope="module")
def deep_artifact(tmp_path_factory, gates, catalog, calibration) -> Path:
    """hopper-fp8 (bf16 KV) of a 6-layer model whose activations do not vanish: the bf16 pass's
    rounding reaches its maxima (see below)."""
    from support.models import write_tiny_model

    tmp = tmp_path_factory.mktemp("deep")
    source = write_tiny_model(
        tmp / "deep", num_hidden_layers=6, hidden_size=128, intermediate_size=256, initializer_range=0.1
    )
    (built,) = build_targets(
        intake(source, gates),
        ["hopper-fp8"],
        tmp / "out",
        catalog,
        calibration,
        kv_cache={"hopper-fp8": KVCache.BF16},
    )
    return built.path


@pytest.mark.heavy
def test_the_kv_pass_gives_the_same_bytes_whatever_the_threads_and_summation_order(
    deep_artifact, catalog, calibration, monkeypatch
):
    """Issue 27 item 4: on the default model 2 vs 16 threads changed 2 of 60 KV scales and AVX2 vs
    AMX 22-42 (by up to 5.5 %), because the pass ran in bf16 with float32 sums. The float64 pass
    gives the same absmax bits under 1 and N threads and with every quantized product summed in
    another order. (On 632d535's bf16 pass the reordered sums moved 4 of this model's 6 layers'
    scales by up to 2 %: six layers with activations that do not vanish carry a flipped FP8
    rounding far enough to reach a maximum.)"""
    from types import SimpleNamespace

    from quantgate.numerics import emulated

    target = catalog.target("hopper-fp8")

    def run() -> dict[str, tuple[float, float]]:
        kv_pass = kvc.calibrate(deep_artifact, target, calibration, 8, 256)
        assert kv_pass.arithmetic.canonical, kv_pass.arithmetic.notes
        return kv_pass.absmax

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run()
        torch.set_num_threads(max(2, threads))
        many = run()
    finally:
        torch.set_num_threads(threads)
    assert one == many
    monkeypatch.setattr(emulated, "F", SimpleNamespace(linear=_reordered_linear))
    assert run() == one


def test_a_layer_too_large_to_hold_decoded_gives_the_same_scales_from_its_fp8_bytes(
    deep_artifact, catalog, calibration, monkeypatch
):
    """Layers whose decode exceeds ``RESIDENT_LAYER_BYTES`` hold their FP8 bytes and decode at each
    product (the memory-cap build: 1.08 -> 0.87 GB peak): the scales must not move by a bit."""
    target = catalog.target("hopper-fp8")
    resident = kvc.calibrate(deep_artifact, target, calibration, 8, 256).absmax
    held: list[bool] = []
    real_defers = kvc._defers
    monkeypatch.setattr(kvc, "RESIDENT_LAYER_BYTES", 0)
    monkeypatch.setattr(kvc, "_defers", lambda layer: held.append(real_defers(layer)) or held[-1])
    assert kvc.calibrate(deep_artifact, target, calibration, 8, 256).absmax == resident
    assert held and all(held)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_kv_pass_on_the_gpu_gives_the_cpus_bytes(deep_artifact, catalog, calibration):
    """Issue 27 item 4: CPU vs GPU changed the KV scales; the float64 pass on cuda gives the CPU's bits."""
    target = catalog.target("hopper-fp8")
    on_cpu = kvc.calibrate(deep_artifact, target, calibration, 8, 256)
    on_gpu = kvc.calibrate(deep_artifact, target, calibration, 8, 256, device="cuda")
    assert on_gpu.device == "cuda" and on_gpu.arithmetic.canonical
    assert on_gpu.absmax == on_cpu.absmax


@pytest.mark.heavy
def test_mixture_of_experts_gets_its_kv_scales_too(_tiny_models, gates, catalog, calibration, tmp_path):
    record = intake(_tiny_models["mixtral"], gates)
    (result,) = build_targets(
        record,
        ["hopper-fp8"],
        tmp_path / "out",
        catalog,
        calibration,
        kv_cache={"hopper-fp8": KVCache.FP8_E4M3},
    )
    assert len(_scales(result.path)) == 4
    assert load_for_eval(result.path).numerics.kv_cache_layers == 2


@pytest.mark.heavy
def test_a_sharded_artifact_gets_its_scales_as_one_more_indexed_file(tmp_path, gates, catalog, calibration):
    source = write_large_llama(
        tmp_path / "sharded", hidden_size=128, intermediate_size=256, num_hidden_layers=3, vocab_size=512,
        max_shard_bytes=400 * 1024,
    )  # fmt: skip
    record = intake(source, gates)
    (result,) = build_targets(record, ["hopper-fp8"], tmp_path / "out", catalog, calibration)
    index = json.loads((result.path / "model.safetensors.index.json").read_text())
    scale_names = sorted(_scales(result.path))
    assert len(scale_names) == 6 and {index["weight_map"][n] for n in scale_names} == {kvc.SCALES_FILE}
    assert not (result.path / "model.safetensors").exists()
    report = load_for_eval(result.path).numerics  # transformers reads every indexed file
    assert report.kv_cache_calibrated and report.kv_cache_layers == 3


def test_appending_tensors_keeps_every_tensor_and_loads(tmp_path):
    path = tmp_path / "model.safetensors"
    before = {"a": torch.arange(7, dtype=torch.float32), "b": torch.ones(3, 5, dtype=torch.bfloat16)}
    save_file(before, path, metadata={"format": "pt"})
    added = {"x.k_scale": torch.tensor([0.25], dtype=torch.bfloat16)}
    kvc.append_tensors(path, added)
    with safe_open(path, "pt") as f:
        assert f.metadata() == {"format": "pt"}
        got = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    assert got.keys() == {"a", "b", "x.k_scale"}
    assert all(torch.equal(got[k], v) for k, v in {**before, **added}.items())


def test_the_calibrated_recipe_gets_the_scheme_only_when_asked(catalog):
    recipe = catalog.recipe("nvfp4").recipe
    with_kv = kvc.with_kv_cache_scheme(recipe)
    assert (
        with_kv["quant_stage"]["quant_modifiers"]["QuantizationModifier"]["kv_cache_scheme"]
        == kvc.KV_CACHE_SCHEME
    )
    assert "kv_cache_scheme" not in json.dumps(recipe)  # the recipe file's own dict is untouched
    gptq = kvc.with_kv_cache_scheme(catalog.recipe("w4a16-gptq-g64").recipe)
    assert "kv_cache_scheme" in gptq["quant_stage"]["quant_modifiers"]["GPTQModifier"]


def test_check_declared_refuses_a_scheme_the_policy_did_not_ask_for(overridden, tmp_path):
    _, results = overridden
    copy = Path(shutil.copytree(results["hopper-fp8"].path, tmp_path / "copy"))
    kvc.check_declared(copy, "hopper-fp8", KVCache.FP8_E4M3)
    with pytest.raises(Exception, match="keeps the KV cache in bf16 but the artifact declares"):
        kvc.check_declared(copy, "hopper-fp8", KVCache.BF16)
    draft = results["draft-int4"].path
    with pytest.raises(Exception, match="asks for an FP8 KV cache but the artifact has no kv_cache_scheme"):
        kvc.check_declared(draft, "draft-int4", KVCache.FP8_E4M3)


@pytest.mark.heavy
def test_a_layer_of_the_pass_costs_what_the_layer_holds(overridden, catalog, calibration, monkeypatch):
    """A 1,400-layer artifact in 10,000 shards (30 MB) spent 3.3 s a layer in this pass: each layer
    walked every tensor name of the artifact eight times, rebuilt transformers' conversion mapping
    (a walk over every module) and collected garbage over the whole model. Now the tensor list is
    walked once and the mapping built once for the whole pass, and the collection after each layer
    skips what existed before the loop (the skeleton)."""
    from quantgate.numerics import artifact as numerics_artifact

    walks: list[int] = []
    mappings: list[int] = []
    frozen: list[int] = []

    class Walked(dict):
        def items(self):
            walks.append(len(self))
            return super().items()

    real_skeleton, real_mapping, real_release = (
        kvc._skeleton,
        numerics_artifact.disk_to_memory,
        kvc._release_memory,
    )

    def skeleton(artifact_dir):
        model, layers, layers_name, tensors, *rest = real_skeleton(artifact_dir)
        return (model, layers, layers_name, Walked(tensors), *rest)

    def mapping(model):
        mappings.append(1)
        return real_mapping(model)

    def release():
        frozen.append(gc.get_freeze_count())
        real_release()

    monkeypatch.setattr(kvc, "_skeleton", skeleton)
    monkeypatch.setattr(numerics_artifact, "disk_to_memory", mapping)
    monkeypatch.setattr(kvc, "_release_memory", release)
    kvc.calibrate(overridden[1]["hopper-fp8"].path, catalog.target("hopper-fp8"), calibration, 2, 32)
    assert len(walks) == 1, f"the artifact's tensor list was walked {len(walks)} times for 2 layers"
    assert len(mappings) == 1, f"the conversion mapping was built {len(mappings)} times for 2 layers"
    assert len(frozen) == 2 and all(count > 0 for count in frozen), frozen
    assert gc.get_freeze_count() == 0  # unfrozen after the pass
