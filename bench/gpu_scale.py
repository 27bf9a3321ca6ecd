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
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Self

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


# the H200's dense bf16 matrix rate as measured on the lent machine (the device tool's KINDS.md:
# about 790 TFLOP/s; the datasheet's 989 is not reached by any GEMM there)
BF16_PEAK = 790e12
WIKITEXT_TOKENS = 128 * 2048  # the full profile's wikitext windows, scored by both sides
TRAINED = {"135m"}  # sizes taken from --trained rather than made with random weights
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


def _params(checkpoint: Path) -> int:
    """Parameters stored in ``checkpoint``'s safetensors files (read from their headers)."""
    from safetensors import safe_open

    total = 0
    for f in checkpoint.glob("*.safetensors"):
        with safe_open(f, "pt") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open is no mapping)
                total += math.prod(st.get_slice(name).get_shape())
    return total


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


def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and every process below it (an anchor may spawn workers)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += next(int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("VmRSS:")) * 1024
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, StopIteration, ValueError):
            continue
    return total


class _Peaks:
    """A step's peak host memory (its process tree's RSS) and the GPU's most memory in use while it
    ran, polled every half second: the step is another process, and its rusage is no help (Linux
    carries a forked child's maxrss over from its parent, which made the source)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.rss, self.gpu_mib = pid, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._smi = shutil.which("nvidia-smi")

    def _poll(self) -> None:
        query = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
        while not self._stop.is_set():
            self.rss = max(self.rss, _tree_rss(self.pid))
            if self._smi:
                try:
                    used = subprocess.run(query, capture_output=True, text=True, timeout=5, check=False)
                    self.gpu_mib = max([self.gpu_mib, *(int(x) for x in used.stdout.split() if x.isdigit())])
                except (OSError, subprocess.TimeoutExpired):
                    self._smi = None
            self._stop.wait(0.5)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def timed(cmd: list[str], log: Path, timeout: float) -> dict:
    """``cmd`` in its own process: wall seconds, exit code, and the peaks ``_Peaks`` polls."""
    started = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        with _Peaks(proc.pid) as peaks:
            try:
                rc: int | str = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                rc = "timeout"
    return {
        "rc": rc,
        "seconds": round(time.perf_counter() - started, 2),
        "peak_rss_gib": round(peaks.rss / 2**30, 2),
        "peak_gpu_gib": round(peaks.gpu_mib / 1024, 2),
        "log": log.name,
    }


def roofline(config: dict, params: int, tokens: int, seconds: float | None, window: int = 2048) -> dict:
    """What a scoring pass of ``tokens`` tokens in ``window``-token windows must compute, and what
    ``seconds`` of it achieved against the measured bf16 rate: FLOPs as 2 per weight per token
    (every linear and the head; the embedding is a lookup) plus the causal attention products
    (4 x layers x hidden x window / 2 per token)."""
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, head_dim = (
        config["num_attention_heads"],
        config.get("head_dim") or hidden // config["num_attention_heads"],
    )
    embedding = config["vocab_size"] * hidden
    matmul = params - (0 if config.get("tie_word_embeddings") else embedding)
    flops = tokens * (2 * matmul + 4 * layers * heads * head_dim * window / 2)
    out = {"tokens": tokens, "tflop": round(flops / 1e12, 1)}
    if seconds:
        out["tflop_per_s"] = round(flops / seconds / 1e12, 1)
        out["of_bf16_peak"] = round(flops / seconds / BF16_PEAK, 3)
    return out


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
    parser.add_argument(
        "--trained", type=Path, default=None, help="the converted default model, for --sizes 135m"
    )
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
        if size in TRAINED:  # a trained checkpoint given as it is: numerics too, not only speed
            if args.trained is None:
                raise SystemExit(f"--sizes {size} needs --trained DIR (the converted default model)")
            (work / "source").symlink_to(args.trained.resolve())
            r["source"] = {"params": _params(args.trained), "trained": str(args.trained)}
        else:
            r["source"] = make_source(size, args.tokenizer, work / "source", device)
        config = json.loads((work / "source" / "config.json").read_text())
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
            seconds = meta.get("seconds") or {}
            r["roofline"] = {
                "source_reference": roofline(config, r["source"]["params"], WIKITEXT_TOKENS,
                                             seconds.get("source", {}).get("reference:wikitext")),
                "artifact_scoring": roofline(config, r["source"]["params"], WIKITEXT_TOKENS,
                                             seconds.get("hopper-fp8", {}).get("wikitext")),
            }  # fmt: skip
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
        inside = r["anchor_eval_source"]["inside"] = _last_json(args.out / f"{size}-anchor-eval.log")
        r.setdefault("roofline", {})["anchor_scoring"] = roofline(
            config, r["source"]["params"], WIKITEXT_TOKENS, (inside or {}).get("score_s")
        )
        save()
        shutil.rmtree(work / "anchor", ignore_errors=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
