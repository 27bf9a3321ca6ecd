"""Mixture-of-experts artifacts evaluated in their target's numerics, on every layout transformers 5.17 has.

Layouts (conftest.tiny_moe_config): Mixtral, Qwen2-MoE (shared expert + gate), Qwen3-MoE, and
DeepSeek-V3 (dense first layer, shared expert, grouped top-k, latent attention).
"""

from __future__ import annotations

import copy
import gc
import re
import shutil
import time
import weakref
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import save_file

from quantgate.config.targets import Catalog
from quantgate.evaluate.data import DataDir
from quantgate.evaluate.runner import evaluate
from quantgate.evaluate.suites import EvalContext, load_suite
from quantgate.numerics import EmulatedLinear, Float32GemmLinear, load_for_eval, load_source_for_eval
from quantgate.numerics.artifact import read_kv_scales, read_quantized_tensors
from quantgate.numerics.moe import ExpertWeights, QuantizedExperts, expert_key, vllm_expert_names
from quantgate.numerics.weights import DecodedWeight
from quantgate.runtime.errors import InputError, ServingError
from quantgate.serving.check import check_artifact
from support.builds import build_targets

# every test here reads moe_artifacts: twelve tiny MoE builds (four layouts, three targets)
pytestmark = [pytest.mark.unit, pytest.mark.heavy]

KINDS = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")
CASES = [(kind, target) for kind in KINDS for target in ("hopper-fp8", "rocm-cdna3-fp8", "blackwell-nvfp4")]

# What vLLM's MoE loaders match in checkpoint keys: FusedMoE.make_expert_params_mapping builds
# ``experts.{e}.{name}.`` from each model's get_expert_mapping (model_executor/models/mixtral.py:
# ckpt_gate_proj_name="w1", ckpt_down_proj_name="w2", ckpt_up_proj_name="w3"; qwen2_moe.py,
# qwen3_moe.py and deepseek_v2.py: gate_proj, down_proj, up_proj). A per-expert key matching no
# entry is looked up as a plain parameter, which does not exist: the load fails.
VLLM_NAMES = {
    "mixtral": ("w1", "w3", "w2"),
    "qwen2_moe": ("gate_proj", "up_proj", "down_proj"),
    "qwen3_moe": ("gate_proj", "up_proj", "down_proj"),
    "deepseek_v3": ("gate_proj", "up_proj", "down_proj"),
}

ROLES = {"w1": "gate", "gate_proj": "gate", "w3": "up", "up_proj": "up", "w2": "down", "down_proj": "down"}


def _keys(artifact: Path) -> dict[str, torch.Tensor]:
    out = {}
    for shard in artifact.glob("*.safetensors"):
        with safe_open(shard, "pt") as f:
            names = f.keys()  # a safe_open handle is not iterable
            out.update({k: f.get_tensor(k) for k in names})
    return out


def _built(moe_artifacts, kind: str):
    built = moe_artifacts[kind]
    if built.refused:
        pytest.xfail(f"the build refused {kind}: {built.refused}")
    return built


def _experts_module(model) -> tuple[str, QuantizedExperts]:
    return next((n, m) for n, m in model.named_modules() if isinstance(m, QuantizedExperts))


def _routing(experts: int, tokens: int = 24, k: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, 64, generator=g)
    hidden[0, 5] = 30.0  # an outlier channel
    index = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
    weights = torch.rand(tokens, k, generator=g) + 0.1
    return hidden.bfloat16(), index, weights / weights.sum(-1, keepdim=True)


# ---------------------------------------------------------------------------- names on disk


@pytest.mark.parametrize("kind, target", CASES)
def test_expert_names_are_what_vllms_moe_loader_matches(moe_artifacts, kind, target):
    built = _built(moe_artifacts, kind)
    tensors = _keys(built.artifacts[target])
    n_experts = built.record.num_experts
    gate, up, down = VLLM_NAMES[kind]
    assert vllm_expert_names(built.record.model_type).all() == (gate, up, down)
    patterns = [f"experts.{e}.{name}." for e in range(n_experts) for name in (gate, down, up)]
    per_expert = [k for k in tensors if expert_key(k.rsplit(".", 1)[0]) is not None]
    assert per_expert
    unmatched = [k for k in per_expert if not any(p in k for p in patterns)]
    assert unmatched == []
    # every expert of every MoE layer carries all three quantized projections
    weights = {k.rsplit(".", 1)[0] for k in per_expert if k.endswith((".weight", ".weight_packed"))}
    layers = {k.split(".experts.")[0] for k in weights}
    assert len(weights) == len(layers) * n_experts * 3
    # routers stay bf16 and unquantized: no scale beside them
    routers = [k for k in tensors if k.endswith((".gate.weight", "shared_expert_gate.weight"))]
    assert routers and all(tensors[k].dtype == torch.bfloat16 for k in routers)
    assert not [k for k in tensors if ".gate.weight_" in k or "shared_expert_gate.weight_" in k]


def test_renamed_nvfp4_experts_hold_the_source_projection_of_their_name(moe_artifacts, ref):
    """The NVFP4 build's experts are renamed from llm-compressor's gate/up/down to Mixtral's w1/w3/w2:
    each decodes to the source tensor of its own name (a swapped gate and up would decode to the
    other one, as far from it as two unrelated random matrices)."""
    built = _built(moe_artifacts, "mixtral")
    source = _keys(built.source)
    raw = read_quantized_tensors(built.artifacts["blackwell-nvfp4"])
    experts = {name: tensors for name, tensors in raw.items() if expert_key(name) is not None}
    assert len(experts) == 2 * built.record.num_experts * 3
    for name, tensors in experts.items():  # names as on disk
        values, global_scale = _decode_reference(tensors, "blackwell-nvfp4", ref)
        decoded = values / global_scale
        expert, own = name.rsplit(".", 1)
        candidates = {p: source[f"{expert}.{p}.weight"].double() for p in ("w1", "w3", "w2")}
        errors = {
            p: ((decoded - w).norm() / w.norm()).item()
            for p, w in candidates.items()
            if w.shape == decoded.shape
        }
        assert errors[own] < 0.2, (name, errors)
        assert all(errors[own] < 0.5 * e for p, e in errors.items() if p != own), (name, errors)


# ---------------------------------------------------------------------------- numerics of one layer


def test_w8a8_differs_from_w8a16_on_an_expert(moe_artifacts):
    for target in ("hopper-fp8", "rocm-cdna3-fp8", "blackwell-nvfp4"):
        artifact = _built(moe_artifacts, "mixtral").artifacts[target]
        _, w8a8 = _experts_module(load_for_eval(artifact, kv_cache=False).model)
        _, w8a16 = _experts_module(load_for_eval(artifact, activations=False, kv_cache=False).model)
        hidden, index, weights = _routing(w8a8.num_experts)
        # same weights, bit for bit; only the activations' quantization differs
        assert torch.equal(w8a8.gate[0].weight, w8a16.gate[0].weight)
        assert w8a16.gate[0].activation is None and w8a8.gate[0].activation is not None
        unit = torch.ones(hidden.shape[0], 1)  # routing weight 1: the expert's own product, stored
        one, other = w8a8.expert(0, hidden, unit), w8a16.expert(0, hidden, unit)
        assert not torch.equal(one, other)
        assert (one - other).abs().max() > 1e-3 * other.abs().max()
        assert not torch.equal(w8a8(hidden, index, weights), w8a16(hidden, index, weights))


def test_a_moe_artifact_on_an_fp8_gpu_runs_natively_whole_device_check_mocked(moe_artifacts, monkeypatch):
    """hopper-fp8 Mixtral on an FP8 GPU: attention and every expert on the kernel, labelled native,
    the logits those of the emulation up to the kernel's bf16 stores. CPU stands in for the GPU
    (mocked device check; torch's CPU _scaled_mm takes the same row-wise scales)."""
    from quantgate.numerics import native

    artifact = _built(moe_artifacts, "mixtral").artifacts["hopper-fp8"]
    ids = torch.randint(3, 200, (2, 16), generator=torch.Generator().manual_seed(1))
    emulated = load_for_eval(artifact, kv_cache=False)
    monkeypatch.setattr(native, "native_fp8_device", lambda device: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "test GPU")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    loaded = load_for_eval(artifact, kv_cache=False)

    report = loaded.numerics
    assert report.mode == "native" and report.moe_layers == 2
    assert set(report.linears.values()) == {"native"}
    assert any("experts of 2 MoE layers on the same kernel" in note for note in report.notes)
    assert any("experts on the FP8 kernel, stacked" in note for note in report.notes)
    gc.collect()  # the emulated experts the kernel's replaced are gone: only the emulated model's two stay
    assert sum(isinstance(o, QuantizedExperts) for o in gc.get_objects()) == 2
    with torch.no_grad():
        one, other = loaded.model(ids).logits.float(), emulated.model(ids).logits.float()
    assert ((one - other).norm() / other.norm()).item() < 2e-2
    assert (one.argmax(-1) == other.argmax(-1)).float().mean().item() > 0.9


def test_on_an_fp8_gpu_each_layer_is_in_its_kernels_form_before_the_next_decodes_device_check_mocked(
    moe_artifacts, monkeypatch
):
    """The float32 decode of a whole model (4 bytes a parameter: a 70B is twice an H200; the
    30B-A3B shape's load peaked at 7) never exists at once: every layer's emulated modules are
    gone, converted to the kernel's FP8 operands, before the next layer is decoded."""
    from quantgate.numerics import load, native

    monkeypatch.setattr(native, "native_fp8_device", lambda device: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "test GPU")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    decoded, alive_at_each_decode = [], []
    real = load.emulated_modules

    def watched(*args, **kwargs):
        gc.collect()
        alive_at_each_decode.append(sum(ref() is not None for ref in decoded))
        built = real(*args, **kwargs)
        decoded.extend(weakref.ref(m) for m in built.values())
        return built

    monkeypatch.setattr(load, "emulated_modules", watched)
    loaded = load_for_eval(_built(moe_artifacts, "mixtral").artifacts["hopper-fp8"], kv_cache=False)
    assert loaded.numerics.mode == "native" and len(alive_at_each_decode) == 2  # two decoder layers
    assert alive_at_each_decode == [0, 0]


def test_a_layers_quantized_bytes_are_read_just_before_its_decode_never_the_whole_models(
    moe_artifacts, monkeypatch
):
    """The raw FP8 bytes of a 70B are 70 GB: a load reads one decoder layer's tensors, decodes it,
    and only then reads the next."""
    from quantgate.numerics import load

    events: list[tuple[str, set[str]]] = []
    layer = lambda names: {re.search(r"layers\.(\d+)\.", n)[1] for n in names}
    real_read, real_decode = load.read_modules, load.emulated_modules

    def read(index, *args, **kwargs):
        events.append(("read", layer(index)))
        return real_read(index, *args, **kwargs)

    def decode(artifact_dir, raw, *args, **kwargs):
        events.append(("decode", layer(raw)))
        return real_decode(artifact_dir, raw, *args, **kwargs)

    monkeypatch.setattr(load, "read_modules", read)
    monkeypatch.setattr(load, "emulated_modules", decode)
    load_for_eval(_built(moe_artifacts, "mixtral").artifacts["hopper-fp8"], kv_cache=False)
    assert events == [("read", {"0"}), ("decode", {"0"}), ("read", {"1"}), ("decode", {"1"})]


@pytest.mark.parametrize("target", ["hopper-fp8", "blackwell-nvfp4"])
def test_each_rank_reads_only_its_slice_of_every_cut_module(moe_artifacts, monkeypatch, target):
    """Under --devices 2 a rank reads its half of every module the plan cuts, as ``_cut`` and
    ``_cut_experts`` would have cut it after decoding the whole model: q/k/v and an expert's gate
    and up by their output rows (bias too), o and an expert's down by their input columns (NVFP4:
    packed bytes and block scales alike), a row-wise per-channel scale and every global scale whole."""
    from quantgate.numerics.artifact import disk_to_memory, meta_skeleton, read_style
    from quantgate.runtime import sharding

    artifact = _built(moe_artifacts, "mixtral").artifacts[target]
    whole = read_quantized_tensors(artifact)
    skeleton = meta_skeleton(artifact)
    rename = disk_to_memory(skeleton)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    sliced = read_quantized_tensors(
        artifact, "cpu", sharding.slicer(lambda name: read_style(skeleton, name), rename)
    )
    assert sliced.keys() == whole.keys()
    checked = set()
    for module, tensors in whole.items():
        wanted = read_style(skeleton, rename(module))
        assert wanted is not None, module  # every quantized module of a Mixtral is cut by its plan
        dim = 0 if wanted.startswith("colwise") else 1
        for local, tensor in tensors.items():
            mine = sliced[module][local]
            if tensor.ndim <= dim or tensor.shape[dim] == 1:
                assert torch.equal(mine.float(), tensor.float()), (module, local)
                continue
            half = tensor.shape[dim] // 2
            expected = tensor.narrow(dim, half, half)
            assert torch.equal(mine.view(torch.uint8), expected.contiguous().view(torch.uint8)), (
                module,
                local,
            )
            checked.add((module.rsplit(".", 1)[1], dim))
    projections = {p for p, _ in checked}
    assert {"q_proj", "o_proj", "w1", "w3", "w2"} <= projections
    assert ("o_proj", 1) in checked and ("w2", 1) in checked and ("q_proj", 0) in checked


def _decode_reference(
    tensors: dict[str, torch.Tensor], target: str, ref
) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 weight values (grid value x local scale) and the global scale, from the raw bits."""
    if target == "blackwell-nvfp4":
        packed = tensors["weight_packed"].to(torch.int64)
        nibbles = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(packed.shape[0], -1)
        blocks = ref.decode(tensors["weight_scale"].view(torch.uint8).to(torch.int64), 3, 7, 4)
        values = ref.decode(nibbles, 1, 1, 2) * blocks.repeat_interleave(16, dim=1)
        return values, tensors["weight_global_scale"].double().reshape(())
    codes = tensors["weight"].view(torch.uint8).to(torch.int64)
    scale = tensors["weight_scale"].double().reshape(-1, 1)
    if target == "rocm-cdna3-fp8":  # the same bits read as fnuz (0x80 zeroed), scales doubled
        values = ref.decode(codes, 3, 8, 4)
        values[codes == 0x80] = 0.0
        return values * (2 * scale), torch.tensor(1.0, dtype=torch.float64)
    return ref.decode(codes, 3, 7, 4) * scale, torch.tensor(1.0, dtype=torch.float64)


def _reference_layer(raw: dict[str, dict[str, torch.Tensor]], layer: str, target: str, ref):
    """A function computing the layer's experts in float64 from the raw tensors, with the kernel's
    rounding points (bf16 stores, float32 SiLU, routing weight before the store, bf16 top-k sum)."""
    experts: dict[int, dict[str, dict[str, torch.Tensor]]] = {}
    for name, tensors in raw.items():
        key = expert_key(name)
        if key is not None and name.startswith(layer):
            experts.setdefault(key[1], {})[ROLES[key[2]]] = tensors
    gate_name, up_name, down_name = "gate", "up", "down"
    if target == "blackwell-nvfp4":
        w13 = min(
            t["input_global_scale"].item() for e in experts.values() for p, t in e.items() if p != down_name
        )
        w2 = min(e[down_name]["input_global_scale"].item() for e in experts.values())
        act1 = lambda x: ref.nvfp4(x, torch.tensor([w13]))
        act2 = lambda x: ref.nvfp4(x, torch.tensor([w2]))
    else:
        grid, qmax = (ref.e4m3fnuz, 224.0) if target == "rocm-cdna3-fp8" else (ref.e4m3fn, 448.0)
        act1 = act2 = lambda x: ref.per_token(x, grid, qmax)

    def expert(e: int, x: torch.Tensor) -> torch.Tensor:
        (wg, sg), (wu, _), (wd, sd) = (
            _decode_reference(experts[e][p], target, ref) for p in (gate_name, up_name, down_name)
        )
        xq = act1(x).double()
        g = (xq @ wg.T / sg).bfloat16()
        u = (xq @ wu.T / sg).bfloat16()  # the fused gate/up GEMM divides by the gate's global scale
        h = (torch.nn.functional.silu(g.float()) * u.float()).bfloat16()
        return act2(h).double() @ wd.T / sd

    def layer_forward(hidden, index, weights):
        contributions = torch.zeros(*index.shape, hidden.shape[-1], dtype=torch.bfloat16)
        for t in range(index.shape[0]):
            for slot in range(index.shape[1]):
                y = expert(int(index[t, slot]), hidden[t : t + 1])[0]
                contributions[t, slot] = (y * weights[t, slot].double()).bfloat16()
        out = contributions[:, 0]
        for slot in range(1, index.shape[1]):
            out = (out.float() + contributions[:, slot].float()).bfloat16()
        return out

    return layer_forward


def _bf16_ulp(y: torch.Tensor) -> torch.Tensor:
    exponent = torch.floor(torch.log2(y.abs().double().clamp(min=2.0**-100)))
    return torch.pow(2.0, exponent - 7)


@pytest.mark.parametrize("kind, target", CASES)
def test_experts_equal_an_independent_float64_decode(moe_artifacts, kind, target, ref):
    artifact = _built(moe_artifacts, kind).artifacts[target]
    name, emulated = _experts_module(load_for_eval(artifact, kv_cache=False).model)
    layer = name.split(".mlp.")[0] + "."
    reference = _reference_layer(read_quantized_tensors(artifact), layer, target, ref)
    hidden, index, weights = _routing(emulated.num_experts)
    expected = reference(hidden, index, weights)

    exact = copy.deepcopy(emulated)  # the same operands multiplied in float64: the reference exactly
    for module in exact.modules():
        if isinstance(module, EmulatedLinear):
            module.compute_dtype = torch.float64
    assert torch.equal(exact(hidden, index, weights), expected)

    out = emulated(hidden, index, weights)  # float32 accumulation, as the kernels
    assert out.dtype == torch.bfloat16 and out.shape == hidden.shape
    assert (out == expected).float().mean() > 0.9
    tolerance = 4 * _bf16_ulp(expected) + 1e-2 * expected.abs().max().double()
    assert ((out.double() - expected.double()).abs() <= tolerance).all()


def test_unquantized_experts_route_and_combine_as_transformers(moe_artifacts):
    """The per-expert module with the source's bf16 weights and no quantization is transformers' own
    experts forward (gate rows before up rows, routing weights per slot), up to bf16 rounding order."""
    for kind in KINDS:
        model = load_source_for_eval(moe_artifacts[kind].source).model  # the source, built or not
        fused = next(m for n, m in model.named_modules() if n.endswith("mlp.experts"))
        n_experts, two_i, _ = fused.gate_up_proj.shape

        def weight(w: torch.Tensor) -> DecodedWeight:
            return DecodedWeight(values=w.float(), scales=torch.ones(w.shape[0], 1))

        experts = [
            ExpertWeights(
                gate=weight(fused.gate_up_proj[e, : two_i // 2]),
                up=weight(fused.gate_up_proj[e, two_i // 2 :]),
                down=weight(fused.down_proj[e]),
            )
            for e in range(n_experts)
        ]
        ours = QuantizedExperts(experts, None, fused.act_fn, weight_format="bf16")
        hidden, index, weights = _routing(n_experts, seed=1)
        with torch.no_grad():
            theirs = fused(hidden, index, weights)
        torch.testing.assert_close(ours(hidden, index, weights), theirs, rtol=2e-2, atol=2e-3)


# ---------------------------------------------------------------------------- whole models


@pytest.fixture(scope="module")
def tiny_text_suite(tmp_path_factory, repo_root):
    base = tmp_path_factory.mktemp("moe-suite")
    (base / "data").mkdir()
    (base / "data" / "corpus.txt").write_text(
        " ".join(f"Item {i} comes after item {i - 1}." for i in range(300))
    )
    spec = base / "tiny-text.yaml"
    spec.write_text(
        "name: tiny-text\nkind: text\ndescription: t\ndata: {local: corpus.txt}\n"
        "profiles: {smoke: {tokens: 256, seq_len: 64, batch_size: 2}, full: {tokens: 512, seq_len: 64}}\n"
        "metrics: [perplexity, kld_mean, kld_p99, top1_agreement]\n"
    )
    return [load_suite(spec)], EvalContext("smoke", DataDir((base / "data",)), repo_root, base / "cache")


@pytest.mark.parametrize("kind", KINDS)
def test_kld_is_positive_for_every_quantized_target(moe_artifacts, kind, tiny_text_suite, tmp_path):
    built = _built(moe_artifacts, kind)
    suites, ctx = tiny_text_suite
    artifacts = built.artifacts[next(iter(built.artifacts))].parent
    started = time.perf_counter()
    run = evaluate(built.source, built.record.content_hash, artifacts, tmp_path / "eval", suites, ctx)
    seconds = time.perf_counter() - started
    assert set(run.summary) == {"source", *built.artifacts}
    assert run.summary["source"]["tiny-text.kld_mean"] == 0.0
    for target in built.artifacts:
        kld = run.summary[target]["tiny-text.kld_mean"]
        assert kld > 0 and torch.isfinite(torch.tensor(kld)), (target, kld)
        numerics = run.numerics[target]
        assert numerics["mode"] == "emulated" and numerics["moe_layers"] >= 1
        assert numerics["activations"] != "none"
    # hopper and rocm share bytes but not numerics: weights and per-token activations read as fnuz
    # with doubled scales are the same values (the fnuz grid is the OCP grid halved), the KV cache
    # is not (ROCm uses the stored scales on the fnuz grid). Latent attention's cache is not
    # emulated (test_deepseek_latent_attention_says_what_its_kv_cache_does): the two agree there.
    hopper, rocm = (run.summary[t]["tiny-text.kld_mean"] for t in ("hopper-fp8", "rocm-cdna3-fp8"))
    assert (hopper == rocm) if kind == "deepseek_v3" else (hopper != rocm)
    print(f"{kind}: evaluated source + {len(built.artifacts)} artifacts in {seconds:.1f} s")


def test_deepseek_latent_attention_says_what_its_kv_cache_does(moe_artifacts):
    loaded = load_for_eval(_built(moe_artifacts, "deepseek_v3").artifacts["hopper-fp8"])
    report = loaded.numerics
    assert report.kv_cache_layers == 0 and "MLA" in report.kv_cache
    assert any("latent" in note and "decoding" in note for note in report.notes)
    # its k_scale covers the cached latent (kv_c_normed and the rotary k_pe); v_scale mirrors it
    scales = read_kv_scales(_built(moe_artifacts, "deepseek_v3").artifacts["hopper-fp8"])
    assert sorted(scales) == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    assert all(float(k) > 0 and torch.equal(k, v) for k, v in scales.values())
    assert report.kv_cache_calibrated is True
    # the dense first layer is Linear, the second layer's experts per expert, its shared expert Linear
    model = loaded.model
    assert isinstance(model.get_submodule("model.layers.0.mlp.gate_proj"), EmulatedLinear)
    assert isinstance(model.get_submodule("model.layers.1.mlp.experts"), QuantizedExperts)
    assert isinstance(model.get_submodule("model.layers.1.mlp.shared_experts.down_proj"), EmulatedLinear)
    assert model.get_submodule("model.layers.1.mlp.gate").weight.dtype == torch.bfloat16
    ids = torch.randint(3, 512, (1, 8), generator=torch.Generator().manual_seed(0))
    assert model.generate(ids, max_new_tokens=3, do_sample=False).shape == (1, 11)


def test_qwen2_moe_shared_expert_is_quantized_and_its_gate_is_not(moe_artifacts):
    model = load_for_eval(_built(moe_artifacts, "qwen2_moe").artifacts["hopper-fp8"]).model
    assert isinstance(model.get_submodule("model.layers.0.mlp.shared_expert.up_proj"), EmulatedLinear)
    gate = model.get_submodule("model.layers.0.mlp.shared_expert_gate")
    # a bf16 Linear, multiplied on the CPU as a GPU's bf16 GEMM (numerics.cpu_gemm)
    assert isinstance(gate, Float32GemmLinear)
    assert torch.equal(gate.weight, gate.weight.to(torch.bfloat16).float())


def test_deepseek_nvfp4_keeps_kv_b_proj_bf16_and_its_other_projections_nvfp4(moe_artifacts, catalog):
    """recipes/nvfp4.yaml leaves MLA's kv_b_proj bf16: vLLM decodes with its weights taken back through
    an identity matmul, which NVFP4's static input scale would return scaled (serving rule
    mla-kv-b-dequant). The other attention projections are NVFP4 W4A4, the FP8 KV scale is the
    latent's, and the artifact serves at every TP its 4 heads split over."""
    built = _built(moe_artifacts, "deepseek_v3")
    artifact = built.artifacts["blackwell-nvfp4"]
    tensors = _keys(artifact)
    for i in range(2):
        attn = f"model.layers.{i}.self_attn"
        assert tensors[f"{attn}.kv_b_proj.weight"].dtype == torch.bfloat16
        assert not [k for k in tensors if k.startswith(f"{attn}.kv_b_proj.") and not k.endswith(".weight")]
        for proj in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj"):
            assert tensors[f"{attn}.{proj}.weight_packed"].dtype == torch.uint8
            assert tensors[f"{attn}.{proj}.input_global_scale"].item() > 0
        # one fused_qkv_a_proj in vLLM: llm-compressor gives its two shards one global scale
        assert torch.equal(
            tensors[f"{attn}.q_a_proj.weight_global_scale"],
            tensors[f"{attn}.kv_a_proj_with_mqa.weight_global_scale"],
        )
    # its FP8 KV scale covers the cached latent (kv_c_normed and k_pe), as the FP8 artifacts' does, not
    # the per-head keys and values llm-compressor's kv_cache_scheme would observe: one scale, mirrored
    scales, fp8 = read_kv_scales(artifact), read_kv_scales(built.artifacts["hopper-fp8"])
    assert sorted(scales) == sorted(fp8) == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    for name, (k, v) in scales.items():
        assert torch.equal(k, v) and abs(float(k) / float(fp8[name][0]) - 1) < 0.1, (name, k, fp8[name])
    assert load_for_eval(artifact).numerics.kv_cache_calibrated is True
    table = check_artifact(artifact, catalog.target("blackwell-nvfp4"))
    assert table.loadable_tp == [1, 2, 4] and table.refused_tp == [8]
    # 4 heads over 8 ranks; 64 expert intermediate features: 8 per rank, half an NVFP4 group
    assert {r.rule for r in table.refused[0].refusals} == {"attention-heads", "group-divides-partition"}


def test_deepseek_nvfp4_calibrates_a_quantized_kv_b_proj_and_the_serving_check_refuses_it(
    moe_artifacts, repo_root, moe_calibration, tmp_path
):
    """With kv_b_proj quantized (the recipe's ignore entry removed), calibration runs: transformers
    hands kv_b_proj the latent as one head, [batch, 1, tokens, rank], and llm-compressor's NVFP4
    observer kept per-position statistics that failed to combine across samples of other lengths
    (the engine's pre-hook gives it [batch, tokens, rank]). The build is then refused, naming the
    factor vLLM's decode would scale the layer's weights by."""
    project = tmp_path / "project"
    for part in ("targets", "recipes"):
        shutil.copytree(repo_root / part, project / part)
    recipe_file = project / "recipes" / "nvfp4.yaml"
    recipe = yaml.safe_load(recipe_file.read_text())
    modifier = recipe["recipe"]["quant_stage"]["quant_modifiers"]["QuantizationModifier"]
    modifier["ignore"] = [i for i in modifier["ignore"] if "kv_b_proj" not in i]
    recipe_file.write_text(yaml.safe_dump(recipe))
    record = moe_artifacts["deepseek_v3"].record
    with pytest.raises(ServingError) as info:
        build_targets(record, ["blackwell-nvfp4"], tmp_path / "out", Catalog(project), moe_calibration)
    message = str(info.value)
    assert "self_attn.kv_b_proj" in message and "mla-kv-b-dequant" in message
    assert re.search(r"returns 1\.0 as (?!1 )[0-9.]+", message)


# ---------------------------------------------------------------------------- refusals


def test_an_artifact_missing_an_expert_is_refused_naming_the_layer(moe_artifacts, tmp_path):
    artifact = _built(moe_artifacts, "mixtral").artifacts["hopper-fp8"]
    copy_dir = Path(shutil.copytree(artifact, tmp_path / "damaged"))
    for shard in copy_dir.glob("*.safetensors"):
        with safe_open(shard, "pt") as f:
            names = [k for k in f.keys() if ".layers.1.block_sparse_moe.experts.3." not in k]  # noqa: SIM118
            tensors = {k: f.get_tensor(k) for k in names}
            metadata = f.metadata()
        shard.unlink()  # the copy may share an inode with the original (hard-linked builds)
        save_file(tensors, shard, metadata=metadata)
    with pytest.raises(InputError) as info:
        load_for_eval(copy_dir)
    message = str(info.value)
    assert "experts model.layers.1.block_sparse_moe.experts" in message and "the model has 4" in message


def test_an_artifact_missing_a_router_is_refused_not_initialized_randomly(moe_artifacts, tmp_path):
    artifact = _built(moe_artifacts, "mixtral").artifacts["hopper-fp8"]
    copy_dir = Path(shutil.copytree(artifact, tmp_path / "no-router"))
    for shard in copy_dir.glob("*.safetensors"):
        with safe_open(shard, "pt") as f:
            names = [k for k in f.keys() if k != "model.layers.0.block_sparse_moe.gate.weight"]  # noqa: SIM118
            tensors, metadata = {k: f.get_tensor(k) for k in names}, f.metadata()
        shard.unlink()
        save_file(tensors, shard, metadata=metadata)
    with pytest.raises(InputError, match=r"no tensor for \['model.layers.0.mlp.gate.weight'\].*randomly"):
        load_for_eval(copy_dir)
