"""Issue 27: an artifact's generation on the GPU, recorded steps (CUDA graphs) against eager ones.

``quantgate eval`` skips an artifact's gsm8k when no floor on it can change a verdict, which is
every random-weight artifact (its source solves nothing), so the product's command measured the
source's generation only. This loads an artifact as ``quantgate eval`` does (``load_for_eval``,
native FP8 on Hopper, its FP8 KV cache) and runs the same 32 five-shot GSM8K requests through:

  lm-eval      lm-eval's ``HFLM.generate_until`` on the loaded model (the anchor's backend)
  quantgate    ``QuantgateHFLM`` (``evaluate.decode``: static cache, each step one graph replay),
               twice: the first run records the graph
  eager        the same with the recording switched off (the static cache's eager steps)

and says whether the recorded steps were kept and gave the eager steps' continuations.

Usage on the device:  python3 bench/gpu/gpu_decode_artifact.py ARTIFACT_DIR --data /tmp/qg/datasets
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=64)
    args = parser.parse_args()

    from gpu_lmeval_generation import STOPS, five_shot_prompts
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from quantgate.evaluate import decode
    from quantgate.evaluate.lmeval_hf import QuantgateHFLM
    from quantgate.numerics import load_for_eval

    loaded = load_for_eval(args.artifact, device="cuda")
    print(f"== loaded: mode {loaded.numerics.mode}, attention {loaded.model.config._attn_implementation}")
    prompts = five_shot_prompts(args.data, args.batch)
    kwargs = {"until": STOPS, "max_gen_toks": args.steps, "do_sample": False, "temperature": 0.0}

    def requests() -> list[Instance]:
        return [
            Instance(request_type="generate_until", doc={}, arguments=(p, dict(kwargs)), idx=i)
            for i, p in enumerate(prompts)
        ]

    def timed(lm) -> tuple[float, list[str]]:
        torch.cuda.synchronize()
        started = time.perf_counter()
        out = lm.generate_until(requests(), disable_tqdm=True)
        torch.cuda.synchronize()
        return time.perf_counter() - started, out

    def lm(cls):
        return cls(
            pretrained=loaded.model, tokenizer=loaded.tokenizer, batch_size=args.batch, max_length=4096
        )

    stock, ours = lm(HFLM), lm(QuantgateHFLM)
    timed(stock)  # warm: cuBLAS heuristics, the allocator
    anchor, _ = timed(stock)
    first, graphed = timed(ours)
    again, graphed_again = timed(ours)
    step = getattr(loaded.model, decode._ATTR)
    recorded = step.graph is not None
    step.graph, step.graphs = None, False
    eager, eager_out = timed(ours)
    print(f"== lm-eval: {anchor:.2f} s")
    print(
        f"== quantgate: first {first:.2f} s (records the step), then {again:.2f} s; step recorded: {recorded}"
    )
    print(f"== quantgate, eager steps: {eager:.2f} s")
    same = graphed == eager_out and graphed_again == eager_out
    print(f"== recorded steps give the eager steps' continuations: {same}")
    print(f"== lm-eval / quantgate: {anchor / again:.2f}x")


if __name__ == "__main__":
    main()
