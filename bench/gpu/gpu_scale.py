"""Issue 27 item 2: quantgate's own commands on the GPU, each beside its anchor on the same GPU:
`quantgate build` against llm-compressor's `oneshot` (the same FP8 scheme, FP8 KV scales calibrated
on the same 16 x 512 calibration tokens), `quantgate eval` against lm-eval's HF backend scoring the
same windows, and the GSM8K generation suite against lm-eval's HF generation of the same items.

Nothing can be downloaded on the device, so the sources have random weights of real shapes
(Llama-3.2-1B, Llama-3-8B, Qwen3-30B-A3B; ``--layers`` keeps the first N layers of a shape whose
checkpoint and artifacts do not fit the machine's disk) with the default model's tokenizer (token
ids only index rows), written in 5 GB shards as the hub's checkpoints are: this proves speed and
memory, not numerics (``--sizes 135m --trained DIR`` runs the trained default model). Each step is
the real command in its own process, timed from outside; results go to ``<out>/scale.json`` after
every step, so a step that fails or runs out of time leaves the others.

Usage on the device (BENCHMARKS.md, "GPU workers (issue 27)"):
    python3 bench/gpu/gpu_scale.py --tokenizer DIR --data DATA --out $OUT --sizes 1b,8b
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
    "70b": {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
            "rope_theta": 500000.0, "tie_word_embeddings": False},  # bench/gpu/gpu_offload.py, with --layers
}  # fmt: skip
MOE_COMMON = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_act": "silu", "rms_norm_eps": 1e-6,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "max_position_embeddings": 8192, "head_dim": 128,
    "vocab_size": 151936, "rope_theta": 1000000.0, "tie_word_embeddings": False, "norm_topk_prob": True,
}  # fmt: skip
MOE_SHAPES = {
    "tiny-moe": {"hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "num_experts": 8,
                 "num_experts_per_tok": 2},  # a dry run of the MoE path
    "30b-a3b": {"hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
                "num_attention_heads": 32, "num_key_value_heads": 4, "num_experts": 128, "num_experts_per_tok": 8},
}  # fmt: skip
# hopper-fp8's recipe as llm-compressor runs it: FP8_DYNAMIC weights and activations, routers and
# the head kept, static per-tensor FP8 KV scales observed on the first 16 calibration texts at 512
# tokens (what quantgate's KV pass reads: recipes/fp8-dynamic.yaml)
ANCHOR_BUILD = """
import json, sys, time, torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import QuantizationModifier
src, out, device, texts = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(open(sys.argv[4]).read())
t = time.perf_counter()
model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16, device_map=device)
tok = AutoTokenizer.from_pretrained(src)
data = Dataset.from_dict(dict(tok(texts, truncation=True, max_length=512)))
kv = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
recipe = QuantizationModifier(targets="Linear", scheme="FP8_DYNAMIC", kv_cache_scheme=kv,
                              ignore=["lm_head", "re:.*mlp.gate$", "re:.*router$"])
oneshot(model=model, dataset=data, recipe=recipe, num_calibration_samples=len(texts), max_seq_length=512)
model.save_pretrained(out, save_compressed=True)
tok.save_pretrained(out)
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
# lm-eval's own gsm8k task (5-shot, its stops and filters) on the HF backend, the same items, batch
# size, context and new tokens as quantgate's gsm8k suite in the bench catalog; the local files go
# in through quantgate's data plumbing, the generation is lm-eval's
ANCHOR_GENERATE = """
import json, random, sys, time, torch
from pathlib import Path
from lm_eval.models.huggingface import HFLM
from quantgate.evaluate.lmeval import run_task_on, task_config
src, data, device = sys.argv[1], Path(sys.argv[2]) / "gsm8k", sys.argv[3]
items, batch, max_len, max_gen = (int(x) for x in sys.argv[4:8])
total = sum(1 for _ in open(data / "test.jsonl"))
chosen = sorted(random.Random(0).sample(range(total), min(items, total)))  # the suite's own choice
t0 = time.perf_counter()
lm = HFLM(pretrained=src, dtype="bfloat16", device=device, batch_size=batch, max_length=max_len)
load = time.perf_counter() - t0
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
sync(); t = time.perf_counter()
files = {"train": str(data / "train.jsonl"), "test": str(data / "test.jsonl")}
logs = run_task_on(lm, task_config("gsm8k/gsm8k.yaml"), data_files=files, cache_dir=Path("/tmp/anchor_gen"),
                   items=chosen, batch_size=batch, max_gen_toks=max_gen, num_fewshot=5)
sync()
print(json.dumps({"load_s": load, "generate_s": time.perf_counter() - t, "items": len({l["doc_id"] for l in logs})}))
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


def shape_config(size: str, layers: int | None = None):
    """``size``'s transformers config; ``layers`` keeps the first N decoder layers of the shape."""
    from transformers import LlamaConfig, Qwen3MoeConfig

    if size in MOE_SHAPES:
        cls, fields = Qwen3MoeConfig, {**MOE_COMMON, **MOE_SHAPES[size]}
    else:
        cls, fields = LlamaConfig, {**COMMON, **SHAPES[size]}
    if layers:
        fields["num_hidden_layers"] = layers
    return cls(**fields)


def make_source(size: str, tokenizer: Path, dest: Path, device: str, layers: int | None = None) -> dict:
    """A random-weight checkpoint of ``size``'s shape, written as the hub's checkpoints are: in
    shards of at most 5 GB (transformers 5 would write one file up to 50 GB, which a trained
    checkpoint of these sizes never is, and which intake can hash on only one core)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    started = time.perf_counter()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(shape_config(size, layers), dtype=torch.bfloat16)
    for p in model.parameters():  # from_config's init is N(0, 0.02): keep activations finite over the depth
        p.data.normal_(0, 0.02)
    model.save_pretrained(dest, max_shard_size="5GB")
    for f in tokenizer.iterdir():
        if f.name not in {"config.json", "generation_config.json"} and f.suffix != ".safetensors":
            shutil.copy(f, dest / f.name)
    params = sum(p.numel() for p in model.parameters())
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    shards = len(list(dest.glob("*.safetensors")))
    return {"params": params, "shards": shards, "save_s": time.perf_counter() - started}


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
    (every linear a token runs through, the head; the embedding is a lookup; of a MoE's experts
    only the ones routed to) plus the causal attention products (4 x layers x hidden x window / 2
    per token)."""
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, head_dim = (
        config["num_attention_heads"],
        config.get("head_dim") or hidden // config["num_attention_heads"],
    )
    embedding = config["vocab_size"] * hidden
    matmul = params - (0 if config.get("tie_word_embeddings") else embedding)
    if experts := config.get("num_experts") or config.get("num_local_experts"):  # a token runs top-k
        expert = 3 * hidden * config["moe_intermediate_size"]
        matmul -= layers * (experts - config["num_experts_per_tok"]) * expert
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


def calibration_texts(dest: Path, samples: int = 16) -> Path:
    """The texts quantgate's KV pass reads (the default calibration set's first ``samples``), for
    the anchor's calibration: both sides observe K and V on the same tokens."""
    from quantgate.calibration.builder import load_or_build

    root = Path(__file__).resolve().parents[2]
    texts = load_or_build(root / "calibration_sets" / "default.yaml", dest.parent / "cal-cache").texts()
    dest.write_text(json.dumps(texts[:samples]))
    return dest


def bench_catalog(dest: Path, items: int) -> Path:
    """The repository's catalog with the gsm8k suite's full profile cut to its first ``items``
    (its own seeded choice, its batch size, context and new tokens kept): a generation measurement
    that fits one device call, through ``quantgate eval --root``."""
    root = Path(__file__).resolve().parents[2]
    shutil.rmtree(dest, ignore_errors=True)
    for name in ("targets", "recipes", "calibration_sets", "eval_suites"):
        shutil.copytree(root / name, dest / name)
    shutil.copy(root / "gates.yaml", dest / "gates.yaml")
    suite = dest / "eval_suites" / "gsm8k.yaml"
    text = suite.read_text()
    full = "full: {items: 1319,"
    if full not in text:
        raise SystemExit(f"{suite}: no '{full}' to cut; update bench_catalog to the suite's profile")
    suite.write_text(text.replace(full, f"full: {{items: {items},"))
    return dest


def _gsm8k_full(catalog: Path) -> dict:
    """The gsm8k full profile's sizes, as the bench catalog has them."""
    import yaml

    return yaml.safe_load((catalog / "eval_suites" / "gsm8k.yaml").read_text())["profiles"]["full"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="wikitext-2-raw/ and gsm8k/ in it")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/scale"))
    parser.add_argument("--sizes", default="1b,8b", help=f"of {[*SHAPES, *MOE_SHAPES, *TRAINED]}")
    parser.add_argument("--layers", type=int, default=None, help="keep the first N layers of each shape")
    parser.add_argument("--profile", default="full", help="quantgate eval's profile (smoke for a dry run)")
    parser.add_argument(
        "--gen-items",
        type=int,
        default=128,
        help="gsm8k items generated by both sides (0: no generation step)",
    )
    parser.add_argument("--step-timeout", type=float, default=240)
    parser.add_argument(
        "--no-anchor-build",
        action="store_true",
        help="skip llm-compressor's build (measured before, same shape)",
    )
    parser.add_argument(
        "--skip-scoring", action="store_true", help="no wikitext scoring or gate: build, then generation only"
    )
    parser.add_argument("--keep", action="store_true", help="keep each size's source and artifacts in --work")
    parser.add_argument(
        "--only-generate", action="store_true", help="the generation step alone, on a --keep run's source"
    )
    parser.add_argument(
        "--trained", type=Path, default=None, help="the converted default model, for --sizes 135m"
    )
    args = parser.parse_args()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    qg = [sys.executable, "-m", "quantgate.cli"]
    results: dict = {"device": device, "profile": args.profile}
    texts_for_calibration = calibration_texts(args.work / "calibration.json")
    catalog = bench_catalog(args.work / "catalog", args.gen_items) if args.gen_items else None

    def save() -> None:
        (args.out / "scale.json").write_text(json.dumps(results, indent=1))

    def step(name: str, cmd: list[str], size: str) -> dict:
        r[name] = timed(cmd, args.out / f"{size}-{name}.log", args.step_timeout)
        save()
        return r[name]

    # one untimed process first imports what every timed command imports: the first process on a
    # fresh machine compiles bytecode and fills torch's caches (17-25 s measured), which would
    # otherwise land on whichever command ran first (quantgate's build, before its anchor)
    results["warmup"] = timed([sys.executable, "-c", WARMUP], args.out / "warmup.log", args.step_timeout)
    for size in args.sizes.split(","):
        work = args.work / size
        r: dict = results.setdefault(size, {})
        evaluate = [*qg, "eval", "--checkpoint", str(work / "source"), "--artifacts", str(work / "built"),
                    "--targets", "hopper-fp8", "--fixed", "--device", device]  # fmt: skip
        if args.only_generate:
            generate(r, step, evaluate, catalog, work, size, args, device)
            continue
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        if size in TRAINED:  # a trained checkpoint given as it is: numerics too, not only speed
            if args.trained is None:
                raise SystemExit(f"--sizes {size} needs --trained DIR (the converted default model)")
            (work / "source").symlink_to(args.trained.resolve())
            r["source"] = {"params": _params(args.trained), "trained": str(args.trained)}
        else:
            r["source"] = make_source(size, args.tokenizer, work / "source", device, args.layers)
        config = json.loads((work / "source" / "config.json").read_text())
        r["source"]["layers"] = config["num_hidden_layers"]
        save()
        build = [*qg, "build", "--checkpoint", str(work / "source"), "--targets", "hopper-fp8"]
        step("quantgate_build", [*build, "--device", device, "--out", str(work / "built")], size)
        if not args.no_anchor_build:
            step(
                "anchor_build",
                [sys.executable, "-c", ANCHOR_BUILD, str(work / "source"), str(work / "anchor"), device,
                 str(texts_for_calibration)],
                size,
            )  # fmt: skip
        shutil.rmtree(work / "anchor", ignore_errors=True)  # the disk holds a 30B source and one artifact
        if args.skip_scoring:
            if catalog is not None:
                generate(r, step, evaluate, catalog, work, size, args, device)
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
            continue
        step(
            "quantgate_eval",
            [*evaluate, "--suites", "wikitext", "--profile", args.profile, "--data-dir", str(args.data),
             "--out", str(work / "eval")],
            size,
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
        step(
            "quantgate_gate",
            [*qg, "gate", "--results", str(work / "eval"), "--out", str(work / "report")],
            size,
        )
        r["quantgate_gate"]["report_written"] = (work / "report" / "report.json").exists()
        save()
        texts = work / "texts.json"
        windows = 128 if args.profile == "full" else 4  # a dry run's anchor scores a few
        texts.write_text(json.dumps(wikitext_docs(args.data, args.tokenizer, windows)))
        step(
            "anchor_eval_source",
            [sys.executable, "-c", ANCHOR_EVAL, str(work / "source"), str(texts), "8", device],
            size,
        )
        inside = r["anchor_eval_source"]["inside"] = _last_json(args.out / f"{size}-anchor_eval_source.log")
        r.setdefault("roofline", {})["anchor_scoring"] = roofline(
            config, r["source"]["params"], WIKITEXT_TOKENS, (inside or {}).get("score_s")
        )
        save()
        if catalog is not None:
            generate(r, step, evaluate, catalog, work, size, args, device)
        if not args.keep:  # the next size's source needs the disk (64 GiB on the lent H200)
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results, indent=1))


def generate(
    r: dict, step, evaluate: list[str], catalog: Path, work: Path, size: str, args, device: str
) -> None:
    """The gsm8k suite's generation by ``quantgate eval`` (source and artifact), then lm-eval's HF
    generation of the source on the same items; tokens generated per second of each side."""
    step(
        "quantgate_generate",
        [*evaluate, "--root", str(catalog), "--suites", "gsm8k", "--profile", "full", "--data-dir",
         str(args.data), "--out", str(work / "eval-gsm8k")],
        size,
    )  # fmt: skip
    run = work / "eval-gsm8k" / "run.json"
    if run.exists():
        r["quantgate_generate"]["seconds_inside"] = json.loads(run.read_text()).get("seconds")
    sizes = _gsm8k_full(catalog)
    step(
        "anchor_generate",
        [sys.executable, "-c", ANCHOR_GENERATE, str(work / "source"), str(args.data), device,
         str(sizes["items"]), str(sizes["batch_size"]), str(sizes["max_length"]), str(sizes["max_gen_toks"])],
        size,
    )  # fmt: skip
    r["anchor_generate"]["inside"] = _last_json(args.out / f"{size}-anchor_generate.log")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
