"""Issue 27: where a scoring pass's GPU time goes, kernel by kernel (torch.profiler), for the source's
reference pass and an artifact's scoring pass: the product's own functions (``load_source_for_eval``,
``build_reference``, ``load_for_eval``, ``score``) on the full profile's window and batch sizes.

Usage on the device (after bench/gpu/gpu_offload.py's or gpu_scale.py's source and build):
    python3 bench/gpu/gpu_profile_scoring.py SOURCE ARTIFACT WIKITEXT_RAW --windows 32 > $OUT/profile.txt
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile


def _windows(tokenizer_dir: Path, raw: Path, windows: int, length: int = 2048) -> list[list[int]]:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(tokenizer_dir)(raw.read_text()[: windows * length * 8])["input_ids"]
    return [ids[i : i + length] for i in range(0, windows * length, length)]


def _profiled(name: str, run, tokens: int, device: str) -> None:
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    run(warm=True)  # first pass: allocator, cuBLAS heuristics, lazy modules
    sync()
    started = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
        run(warm=False)
        sync()
    seconds = time.perf_counter() - started
    print(
        f"== {name}: {tokens} tokens in {seconds:.2f} s under the profiler ({tokens / seconds:,.0f} tokens/s)"
    )
    print(
        prof.key_averages().table(
            sort_by="cuda_time_total" if cuda else "cpu_time_total", row_limit=30, max_name_column_width=70
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("source", type=Path)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("raw", type=Path, help="wikitext-2-raw/wiki.test.raw")
    parser.add_argument("--windows", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--eager-too",
        action="store_true",
        help="score again with the eager activation quantization (native.quantize_per_token_eager), for the A/B",
    )
    args = parser.parse_args()
    from quantgate.evaluate.scoring import build_reference, score
    from quantgate.numerics import load_for_eval, load_source_for_eval

    seqs = _windows(args.source, args.raw, args.windows)
    tokens = sum(len(s) - 1 for s in seqs)
    held = [load_source_for_eval(args.source, device=args.device).model]  # released before the artifact loads
    refs = {}

    def reference(warm: bool) -> None:
        refs[warm] = build_reference(held[0], seqs[: args.batch_size] if warm else seqs, k=32,
                                     batch_size=args.batch_size, pad_id=0)  # fmt: skip

    _profiled("source reference (bf16, top-32 kept)", reference, tokens, args.device)
    held.clear()
    if args.device == "cuda":
        torch.cuda.empty_cache()
    artifact = load_for_eval(args.artifact, device=args.device)
    print("artifact numerics:", artifact.numerics.mode, artifact.numerics.notes[0][:120])

    scored: list = []

    def scoring(warm: bool) -> None:
        scored.append(
            score(
                artifact.model,
                seqs[: args.batch_size] if warm else seqs,
                refs[False],
                batch_size=args.batch_size,
                pad_id=0,
            )
        )

    _profiled("artifact scoring (KL against the reference)", scoring, tokens, args.device)
    if args.eager_too:  # the same pass with the eager activation quantization, for the A/B
        from quantgate.numerics import native

        fused = native.quantize_per_token
        native.quantize_per_token = native.quantize_per_token_eager
        _profiled("artifact scoring, eager activation quantization", scoring, tokens, args.device)
        native.quantize_per_token = fused
        same = all(
            torch.equal(a.nll, b.nll) and torch.equal(a.kld, b.kld)
            for a, b in zip(scored[1], scored[3], strict=True)
        )
        print(f"fused and eager scores equal bit for bit: {same}")


if __name__ == "__main__":
    main()
