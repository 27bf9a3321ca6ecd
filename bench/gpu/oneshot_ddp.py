"""llm-compressor's own data-parallel calibration (``oneshot`` under ``torch.distributed.run``),
N processes against one, for issue 29: does the library's DDP path write the artifact one process
writes? This is a probe of the engine ``quantgate build --devices`` would use, not a product
figure (``quantgate build`` does not spread yet: README, "Models larger than one GPU").

    python bench/gpu/oneshot_ddp.py make --size tiny --tokenizer TOK --dest SRC [--layers N] [--device cuda]
    python bench/gpu/oneshot_ddp.py build --source SRC --recipe recipes/nvfp4.yaml --out ONE
    python -m torch.distributed.run --nproc-per-node 2 bench/gpu/oneshot_ddp.py build --source SRC \
        --recipe recipes/nvfp4.yaml --out TWO --backend gloo
    python bench/gpu/oneshot_ddp.py compare ONE TWO --json result.json

The recipe's ``recipe:`` block and its pipeline are handed to ``oneshot`` as ``quantgate build``'s
engine hands them (``quantize/engines/oneshot.py``), on the default calibration set's first
``--samples`` texts. Under torchrun every rank loads the source, the library cuts the calibration
set by rank, all-reduces activation statistics and spreads the weights' quantization parameters over
the ranks (each module's computed on one rank, then broadcast); every rank calls ``save_pretrained``
(its wrapper synchronises them) and rank 0 writes. The process group is ours: the library's
``init_dist`` insists on an accelerator, and on one GPU two ranks share it under gloo (NCCL refuses
two ranks on one device).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from gpu_scale import calibration_texts, make_source  # beside it in bench/gpu/, on the path as a script

ROOT = Path(__file__).resolve().parents[2]


def build(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import yaml
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ranked = "RANK" in os.environ
    if ranked:
        if args.device == "cuda":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
        dist.init_process_group(args.backend)
    from compressed_tensors.offload.utils import as_single_threaded
    from llmcompressor import oneshot

    from quantgate.quantize.engines.oneshot import _onload_device

    spec = yaml.safe_load(args.recipe.read_text())
    extra = {"pipeline": spec["calibration"]["pipeline"]} if spec["calibration"].get("pipeline") else {}
    texts = json.loads(
        calibration_texts(args.out.parent / f"{args.out.name}-texts.json", args.samples).read_text()
    )
    tokenizer = AutoTokenizer.from_pretrained(args.source)
    encoded = tokenizer(texts, truncation=True, max_length=args.seq)
    dataset = Dataset.from_dict(
        {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}
    )
    recipe = spec["recipe"]
    if args.kv:  # as quantgate build adds it for a target whose KV policy is FP8
        from quantgate.quantize.kv_calibration import with_kv_cache_scheme

        recipe = with_kv_cache_scheme(recipe)
    model = AutoModelForCausalLM.from_pretrained(args.source, dtype=torch.bfloat16)
    if args.device == "cuda" and extra.get("pipeline") == "basic":  # it computes where the model is
        model.to("cuda")
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    with _onload_device(args.device):  # the engine's: on "cpu" the pipelines stay off the accelerator
        oneshot(
            model=model,
            tokenizer=tokenizer,
            recipe=yaml.safe_dump(recipe),
            dataset=dataset,
            num_calibration_samples=len(dataset),
            max_seq_length=args.seq,
            shuffle_calibration_samples=False,
            moe_calibrate_all_experts=True,
            **extra,
        )
    calibrated = time.perf_counter() - started
    # compressed-tensors' threaded compression broadcasts pickled modules between ranks, which fails
    # on CPU tensors under gloo (an UntypedStorage without a dtype): every rank compresses alone
    with as_single_threaded():
        model.save_pretrained(args.out, save_compressed=True)
    rank = dist.get_rank() if ranked else 0
    if rank == 0:
        tokenizer.save_pretrained(args.out)
    figures = {
        "rank": rank,
        "world": dist.get_world_size() if ranked else 1,
        "backend": args.backend if ranked else None,
        "device": args.device,
        "calibrate_s": round(calibrated, 2),
        "total_s": round(time.perf_counter() - started, 2),
        "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if torch.cuda.is_available()
        else None,
    }
    print(json.dumps(figures), flush=True)
    if ranked:
        dist.destroy_process_group()


def versus(args: argparse.Namespace) -> None:
    """``quantgate build --targets TARGET --device cuda`` and the bare ``oneshot`` of its recipe (FP8
    KV added, as the build adds it), on the GPU, each timed with its peak memory (gpu_scale.timed)."""
    from gpu_scale import timed

    args.work.mkdir(parents=True, exist_ok=True)

    def product(name: str, *extra: str) -> list[str]:  # quantgate build into work/NAME, its own cache
        return [sys.executable, "-m", "quantgate.cli", "build", "--checkpoint", str(args.source), "--targets",
                args.target, "--device", "cuda", "--out", str(args.work / name), "--cache-dir",
                str(args.work / f"cache-{name}"), *extra]  # fmt: skip

    anchor = [sys.executable, __file__, "build", "--source", str(args.source), "--recipe", str(args.recipe), "--out",
              str(args.work / "anchor"), "--device", "cuda", "--kv"]  # fmt: skip
    result = {
        "quantgate_build": timed(product("built"), args.work / "quantgate_build.log", 1200),
        "oneshot": timed(anchor, args.work / "oneshot.log", 1200),
    }
    result["ratio"] = round(result["quantgate_build"]["seconds"] / result["oneshot"]["seconds"], 2)
    if args.max_memory:  # the same build under a budget the model does not fit: the sequential pipeline
        budget = product("budget", "--max-memory", args.max_memory)
        result["quantgate_build_budget"] = timed(budget, args.work / "quantgate_build_budget.log", 1200)
        result["budget_bytes_equal"] = _digests(args.work / "built" / args.target) == _digests(
            args.work / "budget" / args.target
        )
    manifest = args.work / "built" / args.target / "manifest.json"
    if manifest.exists():
        result["manifest_build"] = json.loads(manifest.read_text()).get("build")
    print(json.dumps(result, indent=1))
    args.json.write_text(json.dumps(result, indent=1))


def _digests(artifact: Path) -> dict[str, str]:
    import hashlib

    return {
        f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(artifact.glob("*.safetensors"))
    }


def compare(args: argparse.Namespace) -> None:
    """Every tensor of the two artifacts, byte for byte; the differing ones with their largest
    difference and how many of their values are zero (a parameter no rank sent stays zero)."""
    import torch
    from safetensors.torch import load_file

    def tensors(path: Path) -> dict[str, torch.Tensor]:
        return {k: v for f in sorted(path.glob("*.safetensors")) for k, v in load_file(f).items()}

    a, b = tensors(args.a), tensors(args.b)
    differing = {}
    for name in sorted(set(a) | set(b)):
        x, y = a.get(name), b.get(name)
        if x is None or y is None or x.shape != y.shape or x.dtype != y.dtype:
            differing[name] = {"missing_or_reshaped": True}
            continue
        if not torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)):
            xf, yf = x.float(), y.float()
            differing[name] = {
                "dtype": str(x.dtype).removeprefix("torch."),
                "max_abs_diff": (xf - yf).abs().max().item(),
                "max_abs": xf.abs().max().item(),
                "zeros": [int((xf == 0).sum()), int((yf == 0).sum())],
            }
    result = {"tensors": len(a), "differing": len(differing), "examples": dict(list(differing.items())[:8])}
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps({**result, "all_differing": sorted(differing)}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("make", help="a random-weight source of a bench shape")
    p.add_argument("--size", default="tiny")
    p.add_argument("--layers", type=int)
    p.add_argument("--tokenizer", type=Path, required=True)
    p.add_argument("--dest", type=Path, required=True)
    p.add_argument("--device", default="cpu")
    p = sub.add_parser("build", help="oneshot with a recipe file (under torchrun: data parallel)")
    p.add_argument("--source", type=Path, required=True)
    p.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "nvfp4.yaml")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--kv", action="store_true", help="add the FP8 KV cache scheme quantgate build adds")
    p = sub.add_parser("versus", help="quantgate build against this oneshot, each timed in its own process")
    p.add_argument("--source", type=Path, required=True)
    p.add_argument("--target", default="blackwell-nvfp4")
    p.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "nvfp4.yaml")
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--max-memory", help="also build under this --max-memory and compare the bytes")
    p = sub.add_parser("compare", help="two artifacts, tensor by tensor")
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.command == "make":
        print(json.dumps(make_source(args.size, args.tokenizer, args.dest, args.device, args.layers)))
    elif args.command == "build":
        build(args)
    elif args.command == "versus":
        versus(args)
    else:
        compare(args)


if __name__ == "__main__":
    sys.exit(main())
