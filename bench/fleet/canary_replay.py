"""Canary replay on the default model: ``quantgate replay`` through two real llama.cpp endpoints.

Usage:  .venv/bin/python bench/fleet/canary_replay.py [--size 16] [--max-tokens 16] [--out F]

Three llama.cpp servers (llama-cpp-python's ``llama_cpp.server``, one thread each) on this CPU:
the default model's GGUF (SmolLM2-135M-Instruct, Q4_1) twice, and the same GGUF requantized to
Q4_0 by llama.cpp's own quantizer (``tests/support/serving_engines.py``), with the model's whole 8192-token context. ``quantgate replay``
(the command line, in its own process) sends the same seeded, traffic-mixed sample of the default
calibration spec's logged prompts to two of them:

- *twin*: Q4_1 against Q4_1, the anchor: two servers of one GGUF must agree fully (1.0, KL 0);
- *requantized*: Q4_1 (stable) against Q4_0 (canary): what a replay floor would judge.

Printed: each pair's summary (top-1 agreement, KL on the top log-probabilities, exact match,
length and refusal deltas), its digest, and the command's wall time.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from quantgate.embedded.smollm2 import gguf_path
from tests.support.serving_engines import llama_server, requantized

N_CTX = 8192  # SmolLM2's own context: the default traffic's long documents run past 2048 tokens


def replay(stable: str, canary: str, size: int, max_tokens: int) -> dict:
    """One ``quantgate replay --json`` run: its summary, digest and wall time."""
    args = [sys.executable, "-m", "quantgate.cli", "replay", "--stable", stable, "--canary", canary]
    args += ["--size", str(size), "--max-tokens", str(max_tokens), "--seed", "0"]
    args += ["--timeout", "900", "--json"]  # a long document's prefill takes minutes on a busy CPU
    start = time.perf_counter()
    done = subprocess.run(args, check=False, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"quantgate replay exited {done.returncode}: {done.stderr[-2000:]}")
    body = json.loads(done.stdout)
    return {"summary": body["summary"], "digest": body["digest"], "wall_s": round(wall, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    gguf = gguf_path()
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(__import__("tempfile").TemporaryDirectory()))
        q4_0 = requantized(gguf, tmp / "smollm2-q4_0.gguf")
        stable = stack.enter_context(llama_server(gguf, n_ctx=N_CTX))
        twin = stack.enter_context(llama_server(gguf, n_ctx=N_CTX))
        canary = stack.enter_context(llama_server(q4_0, n_ctx=N_CTX))
        figures = {
            "twin (Q4_1 vs Q4_1)": replay(stable, twin, args.size, args.max_tokens),
            "requantized (Q4_1 vs Q4_0)": replay(stable, canary, args.size, args.max_tokens),
        }
    result = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {platform.processor() or ''} {__import__('os').cpu_count()} cores".strip(),
        "model": gguf.name,
        "size": args.size,
        "max_tokens": args.max_tokens,
        "pairs": figures,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
