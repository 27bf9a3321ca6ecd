"""Perplexity + KLD pass against lm-eval's HF backend: same model, same tokens, same precision.

Usage:  .venv/bin/python bench/eval/eval_throughput.py [--tokens 8192] [--seq-len 512] [--batch 8] [--repeats 3]

The anchor is lm-eval's own scoring core (``HFLM._loglikelihood_tokens``) at its best setting
measured here (bfloat16, batch 8, length 512), fed exactly our token windows (context = the
first token, continuation = the rest), so both sides score the same 511 tokens per window.
Ours is ``quantgate.evaluate.scoring.score``: perplexity *and* KL divergence to a reference
*and* top-1 agreement, in the same pass, on the model as ``quantgate eval`` loads it
(``load_source_for_eval``: tiled causal attention for prefill). The anchor gets the model as a
user would load it for lm-eval (transformers' default attention, sdpa, the faster of sdpa and
eager here). Runs alternate (anchor, ours) and the median of each is reported with the ratio
measured in this run, so a busy machine slows both alike.

Perplexity parity is checked at equal precision: lm-eval takes ``log_softmax`` in the model's
dtype and quantgate in float32, so in bf16 the two differ by bf16 rounding (reported, not a
defect); with both models in float32 (``--parity-tokens`` tokens) they must agree within 1e-3.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
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
    parser.add_argument(
        "--compile",
        choices=["auto", "1", "0"],
        default="1",
        help="QUANTGATE_COMPILE for quantgate's passes (auto compiles passes of 65,536+ tokens; "
        "a --tokens run is shorter, so the default forces it, and the compile pass is reported apart)",
    )
    parser.add_argument("--parity-tokens", type=int, default=2048, help="tokens for the float32 parity check")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    os.environ["QUANTGATE_COMPILE"] = args.compile

    from lm_eval.models.huggingface import HFLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from quantgate.config import cache_dir, project_root
    from quantgate.declarations.suite_kinds.text import TextSizes
    from quantgate.embedded.smollm2 import default_checkpoint
    from quantgate.evaluate.data import DataDir, load_text
    from quantgate.evaluate.scoring import build_reference, score
    from quantgate.evaluate.suites import load_suite
    from quantgate.evaluate.suites.text import windows
    from quantgate.numerics.load import load_source_for_eval

    root = project_root()
    checkpoint = default_checkpoint(cache_dir())
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    anchor_model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16).eval()
    model = load_source_for_eval(checkpoint).model
    spec = load_suite(root / "eval_suites" / "wikitext.yaml").spec
    text = load_text(DataDir.resolve(None, root), spec.data)

    def token_windows(tokens: int) -> list[list[int]]:
        return windows(tokenizer, text, TextSizes(tokens=tokens, seq_len=args.seq_len, batch_size=args.batch))

    def harness(lm_model) -> HFLM:
        return HFLM(pretrained=lm_model, tokenizer=tokenizer, batch_size=args.batch, max_length=args.seq_len)

    def lm_eval_nll(lm: HFLM, seqs) -> float:
        results = lm._loglikelihood_tokens([(("", ""), s[:1], s[1:]) for s in seqs], disable_tqdm=True)
        return -sum(ll for ll, _ in results)

    def quantgate_nll(q_model, seqs, reference) -> tuple[float, float]:
        scores = score(q_model, seqs, reference, batch_size=args.batch, pad_id=0)
        return float(sum(s.nll.sum() for s in scores)), float(torch.cat([s.kld for s in scores]).mean())

    seqs = token_windows(args.tokens)
    scored = sum(len(s) - 1 for s in seqs)
    start = time.perf_counter()
    reference = build_reference(model, seqs, k=32, batch_size=args.batch, pad_id=0)  # compiles when on
    first_pass_s = time.perf_counter() - start

    anchor_lm = harness(anchor_model)

    def anchor() -> float:
        return lm_eval_nll(anchor_lm, seqs)

    def ours() -> tuple[float, float]:
        return quantgate_nll(model, seqs, reference)

    # each change's before and after in this run: quantgate's scoring on the model as the
    # anchor loads it (sdpa, eager), then with tiled attention but eager, then as shipped
    eager_model = load_source_for_eval(checkpoint).model

    @contextlib.contextmanager
    def compile_setting(value: str):
        os.environ["QUANTGATE_COMPILE"] = value
        try:
            yield
        finally:
            os.environ["QUANTGATE_COMPILE"] = args.compile

    def uncompiled(q_model):
        with compile_setting("0"):
            reference = build_reference(q_model, seqs, k=32, batch_size=args.batch, pad_id=0)

        def run() -> tuple[float, float]:
            with compile_setting("0"):
                return quantgate_nll(q_model, seqs, reference)

        return run

    contenders = {
        "lm-eval": anchor,
        "quantgate": ours,
        "quantgate-sdpa-eager": uncompiled(anchor_model),  # never compiled: the anchor stays as loaded
        "quantgate-tiled-eager": uncompiled(eager_model),
    }
    timings: dict[str, list[float]] = {name: [] for name in contenders}
    results: dict[str, object] = {}
    for run in contenders.values():  # warm-up: allocator, kernels
        run()
    for round_ in range(args.repeats):
        for name in contenders if round_ % 2 == 0 else list(contenders)[::-1]:
            start = time.perf_counter()
            results[name] = contenders[name]()
            timings[name].append(time.perf_counter() - start)
    nll_anchor = results["lm-eval"]
    nll_ours, kld = results["quantgate"]

    med = {k: statistics.median(v) for k, v in timings.items()}
    ppl_anchor, ppl_ours = math.exp(nll_anchor / scored), math.exp(nll_ours / scored)

    # parity at equal precision: both sides in float32, the same windows
    parity_seqs = token_windows(args.parity_tokens)
    parity_scored = sum(len(s) - 1 for s in parity_seqs)
    fp32_anchor = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    fp32_ours = load_source_for_eval(checkpoint).model.float()
    fp32_ref = build_reference(fp32_ours, parity_seqs, k=32, batch_size=args.batch, pad_id=0)
    ppl32_anchor = math.exp(lm_eval_nll(harness(fp32_anchor), parity_seqs) / parity_scored)
    ppl32_ours = math.exp(quantgate_nll(fp32_ours, parity_seqs, fp32_ref)[0] / parity_scored)
    figures = {
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
        "tokens_scored": scored,
        "seq_len": args.seq_len,
        "batch": args.batch,
        "repeats": args.repeats,
        "lm_eval_tokens_per_s": scored / med["lm-eval"],
        "quantgate_tokens_per_s": scored / med["quantgate"],
        "ratio": med["lm-eval"] / med["quantgate"],
        "quantgate_compile": args.compile,
        "quantgate_reference_pass_s_with_compile": first_pass_s,
        "ratio_sdpa_eager": med["lm-eval"] / med["quantgate-sdpa-eager"],
        "ratio_tiled_eager": med["lm-eval"] / med["quantgate-tiled-eager"],
        "perplexity_lm_eval": ppl_anchor,
        "perplexity_quantgate": ppl_ours,
        "perplexity_rel_diff_bf16": abs(ppl_ours - ppl_anchor) / ppl_anchor,
        "parity_tokens_fp32": parity_scored,
        "perplexity_fp32_lm_eval": ppl32_anchor,
        "perplexity_fp32_quantgate": ppl32_ours,
        "perplexity_rel_diff_fp32": abs(ppl32_ours - ppl32_anchor) / ppl32_anchor,
        "kld_mean_vs_self": kld,
        "runs_s": timings,
    }
    print(json.dumps(figures, indent=2))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
