"""Issue 27: where a greedy decode step's time goes at 8B on the GPU, for the generation goal (3x
lm-eval's HF generation). Stop 37 measured about 55 ms a step for a batch of 32 in lm-eval's eager
HF generation and in a compiled static-cache decode alike, where reading 16 GB of weights takes
about 4 ms. This separates the model's forward from ``generate``'s own work per step, and says
whether the step is bound by the GPU or by the host launching its kernels.

Usage on the device:  python3 bench/gpu/gpu_profile_generation.py [--size 8b] [--batch 32] \
    [--prompt 640] [--steps 64] > $OUT/profile_generation.txt

Random weights of the size's shape (``gpu_scale.shape_config``), made on the GPU; speed only.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile


def _timed(run, sync) -> float:
    sync()
    started = time.perf_counter()
    run()
    sync()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="8b")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument(
        "--prompt", type=int, default=640, help="prompt tokens (a 5-shot GSM8K prompt is about this)"
    )
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument(
        "--layers", type=int, default=None, help="keep the first N decoder layers (a CPU smoke run)"
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--static", action="store_true", help="also a static cache with its compiled decode step"
    )
    args = parser.parse_args()

    from gpu_scale import shape_config
    from transformers import AutoModelForCausalLM, DynamicCache, GenerationConfig

    torch.manual_seed(0)
    cuda = args.device == "cuda"
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(
            shape_config(args.size, args.layers), dtype=torch.bfloat16
        ).eval()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    ids = torch.randint(100, 30000, (args.batch, args.prompt), device=args.device)
    mask = torch.ones_like(ids)
    config = GenerationConfig(
        do_sample=False,
        num_beams=1,
        max_new_tokens=args.steps,
        min_new_tokens=args.steps,
        eos_token_id=None,
        pad_token_id=0,
    )

    def generate() -> None:
        model.generate(input_ids=ids, attention_mask=mask, generation_config=config)

    @torch.inference_mode()
    def prefill_only() -> None:
        model(input_ids=ids, attention_mask=mask, use_cache=True)

    @torch.inference_mode()
    def manual_decode() -> None:
        cache = DynamicCache(config=model.config)
        out = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        attention = mask
        for _ in range(args.steps - 1):
            attention = torch.cat([attention, attention.new_ones((args.batch, 1))], dim=1)
            out = model(input_ids=token, attention_mask=attention, past_key_values=cache, use_cache=True)
            token = out.logits[:, -1].argmax(-1, keepdim=True)

    generate()  # warm: allocator, cuBLAS heuristics
    prefill = _timed(prefill_only, sync)
    whole = _timed(generate, sync)
    manual = _timed(manual_decode, sync)
    per_step = (whole - prefill) / (args.steps - 1) * 1e3
    manual_step = (manual - prefill) / (args.steps - 1) * 1e3
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    print(
        f"== {args.size}, batch {args.batch}, prompt {args.prompt}, {args.steps} new tokens: prefill {prefill:.2f} s; "
        f"generate {whole:.2f} s ({per_step:.1f} ms a step); the bare forward loop {manual:.2f} s "
        f"({manual_step:.1f} ms a step); weights {weights / 1e9:.1f} GB, "
        f"{weights / 4.3e12 * 1e3:.1f} ms a step to read at 4.3 TB/s"
    )
    if args.static:
        # transformers compiles the decode step of a static cache (generation_config.compile_config):
        # the first calls compile, the last one is the steady state
        static = GenerationConfig(**{**config.to_dict(), "cache_implementation": "static"})
        for attempt in range(3):
            took = _timed(
                lambda: model.generate(input_ids=ids, attention_mask=mask, generation_config=static), sync
            )
            print(
                f"== static cache, compiled decode, call {attempt + 1}: {took:.2f} s "
                f"({(took - prefill) / (args.steps - 1) * 1e3:.1f} ms a step)"
            )
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
        generate()
        sync()
    # the GPU's busy time is the tables' "Self CUDA time total" (summing key_averages counts it twice)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=15, max_name_column_width=60))


if __name__ == "__main__":
    main()
