"""Perplexity + KLD pass against lm-eval's HF backend: same model, same tokens, same precision.

Usage:  .venv/bin/python bench/eval_throughput.py [--tokens 8192] [--seq-len 512] [--batch 8] [--repeats 3]

The anchor is lm-eval's own scoring core (``HFLM._loglikelihood_tokens``) at its best setting
measured here (bfloat16, batch 8, length 512), fed exactly our token windows (context = the
first token, continuation = the rest), so both sides score the same 511 tokens per window.
Ours is ``quantgate.evaluate.scoring.score``: perplexity *and* KL divergence to a reference
*and* top-1 agreement, in the same pass. Runs alternate (anchor, ours) and the median of each
is reported with the ratio measured in this run, so a busy machine slows both alike.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args()

    from lm_eval.models.huggingface import HFLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from quantgate.embedded.smollm2 import default_checkpoint
    from quantgate.evaluate.data import DataDir, load_text
    from quantgate.evaluate.scoring import build_reference, score
    from quantgate.evaluate.suites import load_suite
    from quantgate.evaluate.suites.text import TextSizes, windows
    from quantgate.paths import cache_dir, project_root

    root = project_root()
    checkpoint = default_checkpoint(cache_dir())
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16).eval()
    spec = load_suite(root / "eval_suites" / "wikitext.yaml").spec
    text = load_text(DataDir.resolve(None, root), spec.data)
    seqs = windows(tokenizer, text, TextSizes(tokens=args.tokens, seq_len=args.seq_len, batch_size=args.batch))
    scored = sum(len(s) - 1 for s in seqs)
    reference = build_reference(model, seqs, k=32, batch_size=args.batch, pad_id=0)

    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=args.batch, max_length=args.seq_len)
    requests = [(("", ""), s[:1], s[1:]) for s in seqs]

    def anchor() -> float:
        results = lm._loglikelihood_tokens(requests, disable_tqdm=True)
        return -sum(ll for ll, _ in results)

    def ours() -> tuple[float, float]:
        scores = score(model, seqs, reference, batch_size=args.batch, pad_id=0)
        return float(sum(s.nll.sum() for s in scores)), float(torch.cat([s.kld for s in scores]).mean())

    timings: dict[str, list[float]] = {"lm-eval": [], "quantgate": []}
    nll_anchor = nll_ours = kld = 0.0
    ours()  # warm-up (allocator, kernels)
    for _ in range(args.repeats):
        start = time.perf_counter()
        nll_anchor = anchor()
        timings["lm-eval"].append(time.perf_counter() - start)
        start = time.perf_counter()
        nll_ours, kld = ours()
        timings["quantgate"].append(time.perf_counter() - start)

    med = {k: statistics.median(v) for k, v in timings.items()}
    ppl_anchor, ppl_ours = math.exp(nll_anchor / scored), math.exp(nll_ours / scored)
    figures = {
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
        "tokens_scored": scored,
        "seq_len": args.seq_len,
        "batch": args.batch,
        "repeats": args.repeats,
        "lm_eval_tokens_per_s": scored / med["lm-eval"],
        "quantgate_tokens_per_s": scored / med["quantgate"],
        "ratio": med["lm-eval"] / med["quantgate"],
        "perplexity_lm_eval": ppl_anchor,
        "perplexity_quantgate": ppl_ours,
        "perplexity_rel_diff": abs(ppl_ours - ppl_anchor) / ppl_anchor,
        "kld_mean_vs_self": kld,
        "runs_s": timings,
    }
    print(json.dumps(figures, indent=2))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
