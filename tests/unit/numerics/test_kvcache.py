"""The FP8 KV cache is evaluated at exactly the scales the artifact stores, as vLLM 0.33 loads them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from quantgate.numerics import kv_cache_format, load_for_eval
from quantgate.numerics.artifact import read_kv_scales
from quantgate.runtime.errors import InputError

pytestmark = pytest.mark.unit

IDS = torch.randint(3, 512, (2, 24), generator=torch.Generator().manual_seed(0))
STATE = "_quantgate_kv_cache"  # where kvcache.py keeps each attention module's hook


def _rewrite(artifact: Path, dest: Path, edit) -> Path:
    copy = Path(shutil.copytree(artifact, dest))
    for shard in copy.glob("*.safetensors"):
        with safe_open(shard, "pt") as f:
            tensors, metadata = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()  # noqa: SIM118
        shard.unlink()  # the copy may share an inode with the original (hard-linked builds)
        save_file(edit(tensors), shard, metadata=metadata)
    return copy


def _hooks(model) -> dict[str, object]:
    return {n: getattr(m, STATE).hook for n, m in model.named_modules() if hasattr(m, STATE)}


@pytest.mark.parametrize(
    ("target", "fmt"), [("hopper-fp8", "fp8_e4m3fn"), ("rocm-cdna3-fp8", "fp8_e4m3fnuz")]
)
def test_each_layer_runs_at_its_stored_scales(artifacts, target, fmt):
    stored = read_kv_scales(artifacts[target])
    assert sorted(stored) == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    loaded = load_for_eval(artifacts[target])
    hooks = _hooks(loaded.model)
    assert sorted(hooks) == sorted(stored)
    for name, (k, v) in stored.items():
        hook = hooks[name]
        # ROCm: vLLM 0.33's CompressedTensorsKVCacheMethod.process_weights_after_loading uses the
        # stored scale on fnuz as-is (BaseKVCacheMethod's doubling is not reached): not doubled here
        assert hook.fmt.name == fmt and torch.equal(hook.k_scale, k) and torch.equal(hook.v_scale, v)
        assert k.dtype == torch.float32 and k.shape == (1,)  # vLLM's k_scale parameter
    report = loaded.numerics
    assert report.kv_cache_calibrated is True and report.kv_cache_scheme == "tensor"
    ks = torch.cat([k for k, _ in stored.values()])
    assert report.k_scale_range == (float(ks.min()), float(ks.max()))
    assert f"{report.k_scale_range[0]:.3g}" in report.kv_cache


def test_changing_a_stored_scale_changes_the_logits(artifacts, tmp_path):
    hopper = artifacts["hopper-fp8"]

    def scale(name: str, factor: float):
        def edit(tensors):
            return {k: (v * factor if k == name else v) for k, v in tensors.items()}

        return edit

    base = load_for_eval(hopper).model(IDS).logits
    for name in ("model.layers.1.self_attn.k_scale", "model.layers.0.self_attn.v_scale"):
        # not a power of two: 2^k scales are absorbed exactly by FP8 unless something saturates
        changed = _rewrite(hopper, tmp_path / name, scale(name, 3.1))
        assert not torch.equal(load_for_eval(changed).model(IDS).logits, base), name
    # and without the KV cache emulated, the scales play no part
    changed = _rewrite(hopper, tmp_path / "k-off", scale("model.layers.1.self_attn.k_scale", 3.1))
    assert torch.equal(
        load_for_eval(changed, kv_cache=False).model(IDS).logits,
        load_for_eval(hopper, kv_cache=False).model(IDS).logits,
    )


@pytest.mark.parametrize(
    ("name", "grid", "qmax"), [("fp8_e4m3fn", "e4m3fn", 448.0), ("fp8_e4m3fnuz", "e4m3fnuz", 240.0)]
)
def test_kv_format_is_x_over_scale_saturated_then_times_scale(ref, name, grid, qmax):
    x = torch.randn(4, 2, 16, 8, generator=torch.Generator().manual_seed(1)) * 0.3
    x[0, 0, 0, :3] = torch.tensor(
        [384 * 0.003, -288 * 0.003, 256 * 0.003]
    )  # e4m3fn grid points  # beyond fnuz's 240 at this scale
    s = torch.tensor([0.003])
    for inputs in (x, x.bfloat16()):
        out = kv_cache_format(name).quantize(inputs, s)
        assert out.dtype == inputs.dtype
        codes = (inputs.float() / s).double().clamp(-qmax, qmax)
        expected = (ref.round(codes, getattr(ref, grid)) * s.double()).to(inputs.dtype)
        assert torch.equal(out, expected)
    # fnuz saturates at 240 x scale where OCP still represents the value: the two differ there
    fn, fnuz = kv_cache_format("fp8_e4m3fn").quantize(x, s), kv_cache_format("fp8_e4m3fnuz").quantize(x, s)
    assert float(fnuz[0, 0, 0, 0]) == pytest.approx(240 * 0.003, rel=1e-6)
    assert float(fn[0, 0, 0, 0]) == pytest.approx(384 * 0.003, rel=1e-6)


def test_a_bf16_kv_artifact_gets_no_kv_emulation(artifacts):
    report = load_for_eval(artifacts["draft-int4"]).numerics
    assert (report.kv_cache, report.kv_cache_layers, report.kv_cache_calibrated) == ("bf16", 0, None)
    assert report.k_scale_range is None


def test_a_declared_scheme_without_scales_is_refused(artifacts, tmp_path):
    def drop(tensors):
        return {k: v for k, v in tensors.items() if not k.endswith(("k_scale", "v_scale"))}

    copy = _rewrite(artifacts["hopper-fp8"], tmp_path / "no-scales", drop)
    with pytest.raises(InputError, match="no k_scale/v_scale tensors are stored"):
        load_for_eval(copy)


def test_a_layer_without_its_scales_is_refused(artifacts, tmp_path):
    def drop(tensors):
        return {
            k: v
            for k, v in tensors.items()
            if not k.startswith("model.layers.1.self_attn.")
            or "scale" not in k.rsplit(".", 1)[1]
            or "proj" in k
        }

    copy = _rewrite(artifacts["hopper-fp8"], tmp_path / "one-layer", drop)
    assert sorted(read_kv_scales(copy)) == ["model.layers.0.self_attn"]
    with pytest.raises(InputError, match=r"model.layers.1.self_attn has no k_scale/v_scale \(1 of 2"):
        load_for_eval(copy)


def test_a_manifest_saying_bf16_with_a_declared_scheme_is_refused(artifacts, tmp_path):
    copy = Path(shutil.copytree(artifacts["hopper-fp8"], tmp_path / "disagree"))
    manifest = json.loads((copy / "manifest.json").read_text())
    (copy / "manifest.json").write_text(json.dumps({**manifest, "kv_cache": "bf16"}))
    with pytest.raises(InputError, match="declares an FP8 KV cache but hopper-fp8 is built with a bf16"):
        load_for_eval(copy)


def test_an_older_fp8_artifact_without_scales_runs_at_scale_one_and_says_so(artifacts, tmp_path):
    def drop(tensors):
        return {k: v for k, v in tensors.items() if not k.endswith(("k_scale", "v_scale"))}

    copy = _rewrite(artifacts["hopper-fp8"], tmp_path / "legacy", drop)
    config = json.loads((copy / "config.json").read_text())
    del config["quantization_config"]["kv_cache_scheme"]
    (copy / "config.json").write_text(json.dumps(config))
    loaded = load_for_eval(copy)
    assert loaded.numerics.kv_cache_calibrated is False and "scale 1.0" in loaded.numerics.kv_cache
    assert all(h.k_scale == 1.0 and h.v_scale == 1.0 for h in _hooks(loaded.model).values())


@pytest.mark.parametrize("target", ["hopper-fp8", "rocm-cdna3-fp8"])
def test_a_cache_storing_each_token_at_write_decodes_the_emulations_tokens(artifacts, target):
    """Decoding stores each new token's K and V quantized once (``StoringCache``) and attention
    reads them as they are, where ``generate`` quantizes the whole cache at every step: the same
    values, so the same tokens; and each stored token went through its layer's storage once."""
    from quantgate.evaluate import decode
    from quantgate.numerics import kvcache
    from quantgate.runtime.greedy import greedy_config, token_ids

    model = load_for_eval(artifacts[target]).model
    hooks = kvcache.stored_hooks(model)
    assert sorted(hooks) == [0, 1]
    ids, mask = IDS.clone(), torch.ones_like(IDS)
    ids[1, :9], mask[1, :9] = 0, 0  # a left-padded row
    eos = token_ids(model.generation_config.eos_token_id)
    config = greedy_config(model)
    config.eos_token_id = eos
    theirs = model.generate(input_ids=ids, attention_mask=mask, generation_config=config, max_new_tokens=20)
    seen: list[int] = []
    quantize = hooks[0].fmt.fn

    def counted(x, scale):
        seen.append(x.shape[2])  # positions stored at once
        return quantize(x, scale)

    object.__setattr__(hooks[0].fmt, "fn", counted)
    try:
        ours = decode.generate(model, ids, mask, max_new_tokens=20, pad_token_id=0, eos_token_ids=eos)
    finally:
        object.__setattr__(hooks[0].fmt, "fn", quantize)
    assert torch.equal(ours, theirs)
    # (one storage format for both layers) the prefill as generate runs it, the whole prompt's K
    # and V of each layer; its copy into the cache; then one position of each per decoding step
    assert seen == [24] * 4 + [24] * 4 + [1] * 4 * 19
