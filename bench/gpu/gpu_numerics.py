"""Issue 27's device figures: the same bytes on any machine, and native vs emulated vs CPU numerics of
the trained default model.

Usage (BENCHMARKS.md, "GPU workers (H200), issue 27", has the exact device commands):
    hashes     python3 bench/gpu/gpu_numerics.py hashes --out X.json DIR...
               sha256 of every file under each DIR (a converted checkpoint, an artifact), keyed by DIR
    numerics   python3 bench/gpu/gpu_numerics.py numerics --source S --artifact A --data D --out X.json
               hopper-fp8 scored on the same windows of the text suites (profile --profile, the first
               --windows of each): native and emulated on the GPU against the GPU's bf16 reference,
               emulated on the CPU against the CPU's; every pair's delta beside gates.yaml's
               numerics_spread (perplexity: its max_delta_pct as perplexity units)
    pstats     python3 bench/gpu/gpu_numerics.py pstats FILE.prof
               the top of a cProfile profile of a quantgate command: by cumulative and by own time
    collapsed  python3 bench/gpu/gpu_numerics.py collapsed FILE.raw
               a py-spy raw profile (every thread) as seconds per function, inclusive and own
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import torch

# gpu_formats_throughput, beside this script (its folder is on the path only when run as a script)
sys.path.insert(0, str(Path(__file__).resolve().parent))
SUITES = ("wikitext", "traffic")
METRICS = ("perplexity", "kld_mean", "kld_p99", "top1_agreement")


def hashes(dirs: list[Path]) -> dict:
    out = {}
    for d in dirs:
        out[str(d)] = {
            str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*"))
            if p.is_file()
        }
    return out


def _windows(tokenizer, profile: str, data: Path, count: int) -> dict:
    from gpu_formats_throughput import _windows_for

    out = {}
    for suite in SUITES:
        spec, sizes, seqs = _windows_for(suite, tokenizer, profile, data)
        out[suite] = (spec, sizes, seqs[:count])
    return out


def _references(source: Path, device: str, windows: dict) -> dict:
    from quantgate.evaluate.scoring import build_reference
    from quantgate.numerics.load import load_source_for_eval

    src = load_source_for_eval(source, device=device)
    pad = src.tokenizer.pad_token_id or 0
    refs = {}
    for suite, (spec, sizes, seqs) in windows.items():
        ref = build_reference(src.model, seqs, k=spec.top_k, batch_size=sizes.batch_size, pad_id=pad)
        refs[suite] = (spec, sizes, seqs, ref, pad)
    return refs


def _score(model, refs: dict, device: str) -> dict:
    from quantgate.evaluate.scoring import score
    from quantgate.evaluate.suites.text import summarize

    out = {}
    for suite, (_spec, sizes, seqs, ref, pad) in refs.items():
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        scores = score(model, seqs, ref, batch_size=sizes.batch_size, pad_id=pad)
        if device == "cuda":
            torch.cuda.synchronize()
        metrics, _ = summarize(suite, scores)
        out[suite] = {"metrics": metrics, "seconds": time.perf_counter() - started, "windows": len(seqs)}
    return out


def numerics(args) -> dict:
    from gpu_formats_throughput import _noise_floor, _spread

    from quantgate.numerics.load import load_for_eval, load_source_for_eval

    tokenizer = load_source_for_eval(args.source).tokenizer
    windows = _windows(tokenizer, args.profile, args.data, args.windows)
    runs, labels = {}, {}
    for platform, device, native in (
        ("gpu_native", "cuda", True),
        ("gpu_emulated", "cuda", False),
        ("cpu", "cpu", False),
    ):
        if device == "cuda" and not torch.cuda.is_available():
            continue
        started = time.perf_counter()
        refs = _references(args.source, device, windows)
        loaded = load_for_eval(args.artifact, device=device, native=native)
        labels[platform] = {
            "mode": loaded.numerics.mode,
            "device": loaded.numerics.device,
            "linears": dict(
                sorted(
                    {
                        v: sum(1 for x in loaded.numerics.linears.values() if x == v)
                        for v in set(loaded.numerics.linears.values())
                    }.items()
                )
            ),
        }
        runs[platform] = _score(loaded.model, refs, device)
        runs[platform]["wall_seconds"] = time.perf_counter() - started
        del loaded, refs
        if device == "cuda":
            torch.cuda.empty_cache()
    spread = _spread()
    pairs = [("gpu_native", "gpu_emulated"), ("gpu_native", "cpu"), ("gpu_emulated", "cpu")]
    deltas: dict = {}
    for a, b in pairs:
        if a not in runs or b not in runs:
            continue
        for suite in SUITES:
            for metric in METRICS:
                va, vb = runs[a][suite]["metrics"][metric], runs[b][suite]["metrics"][metric]
                floor = _noise_floor(spread, suite, metric, vb)
                deltas.setdefault(f"{a}-{b}", {})[f"{suite}.{metric}"] = {
                    a: va,
                    b: vb,
                    "delta": va - vb,
                    "numerics_spread": floor,
                    "ratio_to_spread": None if not floor else abs(va - vb) / floor,
                }
    return {
        "labels": labels,
        "runs": runs,
        "deltas": deltas,
        "profile": args.profile,
        "windows": args.windows,
    }


def print_pstats(path: Path, top: int = 45) -> None:
    """A profile's functions by cumulative time, then by own time (where a command's seconds go)."""
    import pstats

    stats = pstats.Stats(str(path))
    stats.strip_dirs().sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top // 2)


def print_collapsed(path: Path, top: int = 40) -> None:
    """A py-spy raw profile (collapsed stacks, every thread): seconds per function counted once per
    sample it is on the stack (inclusive), and per innermost frame (own), at py-spy's 50 Hz."""
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [
            f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1] + ")"
            for f in stack.split(";")
        ]
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + n
        own[frames[-1]] = own.get(frames[-1], 0) + n
    print(f"samples {total} ({total / 50:.1f} s of thread time at 50 Hz)")
    for title, table in (("inclusive", inclusive), ("own", own)):
        print(f"--- {title}")
        for frame, n in sorted(table.items(), key=lambda kv: -kv[1])[:top]:
            print(f"{n / 50:8.1f} s  {frame}")


def main() -> None:
    if sys.argv[1:2] == ["pstats"]:
        print_pstats(Path(sys.argv[2]))
        return
    if sys.argv[1:2] == ["collapsed"]:
        print_collapsed(Path(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="phase", required=True)
    h = sub.add_parser("hashes")
    h.add_argument("--out", type=Path, required=True)
    h.add_argument("dirs", type=Path, nargs="+")
    n = sub.add_parser("numerics")
    n.add_argument("--source", type=Path, required=True)
    n.add_argument("--artifact", type=Path, required=True)
    n.add_argument("--data", type=Path, required=True)
    n.add_argument("--out", type=Path, required=True)
    n.add_argument("--profile", default="full")
    n.add_argument("--windows", type=int, default=32, help="the first N windows of each suite")
    args = parser.parse_args()
    result = hashes(args.dirs) if args.phase == "hashes" else numerics(args)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(
        json.dumps(
            result if args.phase == "numerics" else {k: len(v) for k, v in result.items()}, default=str
        )[:4000]
    )


if __name__ == "__main__":
    main()
