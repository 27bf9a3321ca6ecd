"""Issue 27: where lm-eval's HF generation loses half its speed against a bare ``generate``.

Stop 37 measured 53 ms a decode step inside lm-eval's gsm8k batches at 8B (batch 32), stop 38
26 ms for transformers' ``generate`` on 640-token prompts without padding. This runs the same
32 five-shot GSM8K prompts (real questions, lm-eval's own ``generate_until``, left-padded) with:

  lm-eval      HFLM.generate_until as the anchor runs it (its per-step stop-sequence check)
  no-stops     the same requests through an HFLM whose ``_model_generate`` drops that check
  bare         transformers' ``generate`` on lm-eval's padded batch (greedy, no criteria)
  unpadded     the same with every prompt cut to the shortest (no padding mask)
  lm-eval, grouped / bare, grouped
               lm-eval and bare again with quantgate's attention (``quantgate_tiled``: a
               padded decoding step groups the heads instead of copying K and V per head)
  quantgate, grouped
               quantgate's own backend (``QuantgateHFLM``: that attention, stops checked every 8 steps,
               ``evaluate.decode``: a static cache, each step one CUDA graph replay)
  profile      lm-eval's run under torch.profiler: the top host and GPU operators

Usage on the device:  python3 bench/gpu/gpu_lmeval_generation.py --tokenizer /tmp/qg/tok \
    --data /tmp/qg/datasets [--size 8b] [--batch 32] [--steps 64] > $OUT/lmeval_generation.txt

Random weights of the size's shape, made on the GPU (speed only: no row ever stops early).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

STOPS = ["Question:", "</s>", "<|im_end|>"]  # lm-eval's gsm8k.yaml


def five_shot_prompts(data: Path, count: int) -> list[str]:
    """``count`` test questions, each after five train examples in lm-eval's gsm8k format."""
    rows = [json.loads(line) for line in (data / "gsm8k" / "train.jsonl").open()][:5]
    shots = "".join(f"Question: {r['question']}\nAnswer: {r['answer']}\n\n" for r in rows)
    tests = [json.loads(line) for line in (data / "gsm8k" / "test.jsonl").open()][:count]
    return [f"{shots}Question: {t['question']}\nAnswer:" for t in tests]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--size", default="8b")
    parser.add_argument("--layers", type=int, default=None, help="keep the first N layers (a CPU smoke run)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()

    from gpu_scale import shape_config
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    torch.manual_seed(0)
    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(
            shape_config(args.size, args.layers), dtype=torch.bfloat16
        ).eval()
    prompts = five_shot_prompts(args.data, args.batch)
    gen_kwargs = {"until": STOPS, "max_gen_toks": args.steps, "do_sample": False, "temperature": 0.0}
    requests = [
        Instance(request_type="generate_until", doc={}, arguments=(p, dict(gen_kwargs)), idx=i)
        for i, p in enumerate(prompts)
    ]

    class NoStops(HFLM):
        def _model_generate(self, context, max_length, stop, **generation_kwargs):
            generation_kwargs.pop("temperature", None)
            return self.model.generate(
                input_ids=context,
                max_length=max_length,
                pad_token_id=self.tokenizer.pad_token_id,
                use_cache=True,
                **{**generation_kwargs, "do_sample": False},
            )

    def timed(run) -> float:
        sync()
        started = time.perf_counter()
        run()
        sync()
        return time.perf_counter() - started

    stock = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=args.batch, max_length=4096)
    nostops = NoStops(pretrained=model, tokenizer=tokenizer, batch_size=args.batch, max_length=4096)
    tokenizer.padding_side = "left"
    encoded = tokenizer(prompts, return_tensors="pt", padding=True).to(args.device)
    lengths = encoded["attention_mask"].sum(1)
    shortest = int(lengths.min())
    unpadded = encoded["input_ids"][:, -shortest:]
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=args.steps,
        min_new_tokens=args.steps,
        eos_token_id=None,
        pad_token_id=0,
    )
    runs = {
        "lm-eval": lambda: stock.generate_until([*requests], disable_tqdm=True),
        "no-stops": lambda: nostops.generate_until([*requests], disable_tqdm=True),
        "bare": lambda: model.generate(**encoded, generation_config=config),
        "unpadded": lambda: model.generate(
            input_ids=unpadded, attention_mask=torch.ones_like(unpadded), generation_config=config
        ),
    }
    print(
        f"== {args.size}, batch {args.batch}, prompts {int(lengths.min())}-{int(lengths.max())} tokens "
        f"(padded to {encoded['input_ids'].shape[1]}), {args.steps} new tokens"
    )
    runs["bare"]()  # warm: allocator, cuBLAS heuristics
    with torch.inference_mode():
        prefill = min(timed(lambda: model(**encoded, use_cache=True, logits_to_keep=1)) for _ in range(2))
    print(f"== prefill of the padded batch: {prefill:.2f} s")
    for name, run in runs.items():
        took = min(timed(run) for _ in range(2))
        print(f"== {name}: {took:.2f} s ({(took - prefill) / (args.steps - 1) * 1e3:.1f} ms a decode step)")
    from quantgate.numerics import attention

    model.set_attn_implementation(attention.register())
    from quantgate.evaluate.lmeval_hf import QuantgateHFLM

    ours = QuantgateHFLM(pretrained=model, tokenizer=tokenizer, batch_size=args.batch, max_length=4096)
    runs["quantgate"] = lambda: ours.generate_until([*requests], disable_tqdm=True)
    for name in ("lm-eval", "bare", "quantgate"):
        first, took = timed(runs[name]), timed(runs[name])  # quantgate's first records its graph
        print(
            f"== {name}, grouped: {took:.2f} s ({(took - prefill) / (args.steps - 1) * 1e3:.1f} ms a decode step); "
            f"first run {first:.2f} s"
        )
    model.set_attn_implementation("sdpa")
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
        runs["lm-eval"]()
        sync()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    main()
