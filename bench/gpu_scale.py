"""Issue 27 item 2: quantgate's own commands on the GPU at 1B and 8B, each beside its anchor on the
same GPU: `quantgate build` against llm-compressor's `oneshot` (the same FP8 scheme), and `quantgate
eval` against lm-eval's HF backend scoring the same windows.

Nothing can be downloaded on the device, so the sources have random weights of real shapes
(Llama-3.2-1B, Llama-3-8B) with the default model's tokenizer (token ids only index rows): this
proves speed and memory, not numerics (the trained default model's numerics are issue 27's other
figures). Each step is the real command in its own process, timed from outside; results go to
``<out>/scale.json`` after every step, so a step that fails or runs out of time leaves the others.

Usage on the device (BENCHMARKS.md, "GPU workers (issue 27)"):
    python3 bench/gpu_scale.py --tokenizer DIR --data DATA --out $OUT --sizes 1b,8b
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

COMMON = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "rms_norm_eps": 1e-5,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "max_position_embeddings": 8192, "head_dim": 128,
    "num_key_value_heads": 8, "vocab_size": 128256,
}  # fmt: skip
SHAPES = {
    "tiny": {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
             "rope_theta": 10000.0, "tie_word_embeddings": True, "head_dim": 64, "num_key_value_heads": 2},  # a dry run of this script
    "1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
           "rope_theta": 500000.0, "tie_word_embeddings": True, "head_dim": 64},
    "8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
           "rope_theta": 500000.0, "tie_word_embeddings": False},
}  # fmt: skip
ANCHOR_BUILD = """
import sys, time, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import QuantizationModifier
src, out = sys.argv[1], sys.argv[2]
t = time.perf_counter()
model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16, device_map=sys.argv[3])
oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme="FP8_DYNAMIC", ignore=["lm_head"]))
model.save_pretrained(out, save_compressed=True)
AutoTokenizer.from_pretrained(src).save_pretrained(out)
print("anchor build", time.perf_counter() - t)
"""
ANCHOR_EVAL = """
import json, sys, time, torch
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM
src, texts_file, batch, device = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
texts = json.loads(open(texts_file).read())
t0 = time.perf_counter()
lm = HFLM(pretrained=src, dtype="bfloat16", device=device, batch_size=batch, max_length=2048)
load = time.perf_counter() - t0
reqs = [Instance(request_type="loglikelihood_rolling", doc={}, arguments=(x,), idx=i) for i, x in enumerate(texts)]
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
sync(); t = time.perf_counter()
lm.loglikelihood_rolling(reqs, disable_tqdm=True)
sync()
print(json.dumps({"load_s": load, "score_s": time.perf_counter() - t}))
"""


WARMUP = "import torch, torch._dynamo, transformers, llmcompressor, lm_eval.models.huggingface, quantgate.cli"


def _last_json(log: Path) -> dict | None:
    """The last line of ``log`` that is a JSON object (what an anchor prints of its own timing)."""
    for line in reversed(log.read_text().splitlines() if log.exists() else []):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def make_source(size: str, tokenizer: Path, dest: Path, device: str) -> dict:
    """A random-weight checkpoint of ``size``'s shape, written as a trained one would be."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    started = time.perf_counter()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            LlamaConfig(**{**COMMON, **SHAPES[size]}), dtype=torch.bfloat16
        )
    for p in model.parameters():  # from_config's init is N(0, 0.02): keep activations finite over the depth
        p.data.normal_(0, 0.02)
    model.save_pretrained(dest)
    for f in tokenizer.iterdir():
        if f.name not in {"config.json", "generation_config.json"} and f.suffix != ".safetensors":
            shutil.copy(f, dest / f.name)
    params = sum(p.numel() for p in model.parameters())
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"params": params, "save_s": time.perf_counter() - started}


def timed(cmd: list[str], log: Path, timeout: float) -> dict:
    started = time.perf_counter()
    with log.open("w") as f:
        try:
            rc = subprocess.run(
                cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, check=False
            ).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return {"rc": rc, "seconds": round(time.perf_counter() - started, 2), "log": log.name}


def wikitext_docs(data: Path, tokenizer: Path, windows: int = 128, per_doc: int = 8) -> list[str]:
    """The full profile's wikitext tokens (``windows`` x 2,048) as documents of ``per_doc`` windows,
    for the lm-eval anchor's rolling log-likelihood (which cuts each document into windows)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer)
    ids = tok((data / "wikitext-2-raw" / "wiki.test.raw").read_text())["input_ids"][: windows * 2048]
    step = per_doc * 2048
    return [tok.decode(ids[i : i + step]) for i in range(0, len(ids), step)]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/scale"))
    parser.add_argument("--sizes", default="1b,8b")
    parser.add_argument("--step-timeout", type=float, default=240)
    args = parser.parse_args()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    args.out.mkdir(parents=True, exist_ok=True)
    qg = [sys.executable, "-m", "quantgate.cli"]
    results: dict = {}

    def save() -> None:
        (args.out / "scale.json").write_text(json.dumps(results, indent=1))

    # one untimed process first imports what every timed command imports: the first process on a
    # fresh machine compiles bytecode and fills torch's caches (17-25 s measured), which would
    # otherwise land on whichever command ran first (quantgate's build, before its anchor)
    results["warmup"] = timed([sys.executable, "-c", WARMUP], args.out / "warmup.log", args.step_timeout)
    for size in args.sizes.split(","):
        work = args.work / size
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        r: dict = results.setdefault(size, {})
        r["source"] = make_source(size, args.tokenizer, work / "source", device)
        save()
        build = [*qg, "build", "--checkpoint", str(work / "source"), "--targets", "hopper-fp8"]
        r["quantgate_build"] = timed(
            [*build, "--device", device, "--out", str(work / "built")],
            args.out / f"{size}-build.log",
            args.step_timeout,
        )
        save()
        r["anchor_build"] = timed(
            [sys.executable, "-c", ANCHOR_BUILD, str(work / "source"), str(work / "anchor"), device],
            args.out / f"{size}-anchor-build.log",
            args.step_timeout,
        )
        save()
        evaluate = [*qg, "eval", "--checkpoint", str(work / "source"), "--artifacts", str(work / "built")]
        r["quantgate_eval"] = timed(
            [*evaluate, "--targets", "hopper-fp8", "--suites", "wikitext", "--profile", "full", "--fixed",
             "--device", device, "--data-dir", str(args.data), "--out", str(work / "eval")],
            args.out / f"{size}-eval.log", args.step_timeout,
        )  # fmt: skip
        run = work / "eval" / "run.json"
        if run.exists():
            meta = json.loads(run.read_text())
            r["quantgate_eval"]["run"] = {
                k: meta.get(k) for k in ("device", "source_forward_passes", "seconds")
            }
        save()
        r["quantgate_gate"] = timed(
            [*qg, "gate", "--results", str(work / "eval"), "--out", str(work / "report")],
            args.out / f"{size}-gate.log",
            args.step_timeout,
        )
        save()
        texts = work / "texts.json"
        texts.write_text(json.dumps(wikitext_docs(args.data, args.tokenizer)))
        r["anchor_eval_source"] = timed(
            [sys.executable, "-c", ANCHOR_EVAL, str(work / "source"), str(texts), "8", device],
            args.out / f"{size}-anchor-eval.log",
            args.step_timeout,
        )
        r["anchor_eval_source"]["inside"] = _last_json(args.out / f"{size}-anchor-eval.log")
        save()
        shutil.rmtree(work / "anchor", ignore_errors=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
