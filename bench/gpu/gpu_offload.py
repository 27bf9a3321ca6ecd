"""Issue 29 on one GPU: a model larger than the memory it is given, evaluated with its layers past
``quantgate eval --max-memory`` offloaded to host memory, against the same model resident.

A 70B-dense shape (Llama-3-70B's layers, random weights made on the device, ``--layers`` of its 80:
the whole checkpoint and its artifact would not fit the lent machine's 64 GiB disk) is built to
hopper-fp8 by ``quantgate build``, then evaluated twice by ``quantgate eval`` at ``--profile full``
on the text suites: resident, and under ``--max-memory``. Each evaluation has its own cache, so the
source's reference is computed offloaded too. The per-window records must be equal bit for bit
(the same modules and kernels run on the copied tensors); ``offload.json`` has the seconds, the peak
GPU and host memory of each step (``gpu_scale.timed``) and the layers each model kept off the GPU.

Usage on the device, in two calls (the machine keeps /tmp between them while it stays warm):
    python3 bench/gpu/gpu_offload.py make-build --tokenizer DIR --work /tmp/o --out $OUT --layers 12
    python3 bench/gpu/gpu_offload.py eval --data DATA --work /tmp/o --out $OUT --max-memory 16GB
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gpu_scale import make_source, timed  # beside it in bench/gpu/, on the path as a script

QG = [sys.executable, "-m", "quantgate.cli"]


def _records(evaluation: Path) -> dict[str, list]:
    """model/suite -> [(item, tokens, nll_sum)] of every scored window."""
    out = {}
    for f in sorted(evaluation.glob("*/*.json")):
        samples = json.loads(f.read_text()).get("samples") or []
        out[f"{f.parent.name}/{f.stem}"] = [
            (s.get("item"), s.get("tokens"), s.get("nll_sum")) for s in samples
        ]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("phase", choices=["make-build", "eval"])
    parser.add_argument("--work", type=Path, default=Path("/tmp/o"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path)
    parser.add_argument("--data", type=Path)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--shape", default="70b", help="gpu_scale's shape (tiny: a dry run on the CPU)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--targets", default="hopper-fp8")
    parser.add_argument("--suites", default="wikitext")
    parser.add_argument("--profile", default="full")
    parser.add_argument("--max-memory", default="16GB")
    parser.add_argument("--step-timeout", type=float, default=400)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    record = args.out / "offload.json"
    results = json.loads(record.read_text()) if record.exists() else {}

    def save() -> None:
        record.write_text(json.dumps(results, indent=1))

    source, built = args.work / "source", args.work / "built"
    if args.phase == "make-build":
        results["source"] = {
            "shape": args.shape,
            **make_source(args.shape, args.tokenizer, source, args.device, args.layers),
        }
        save()
        results["build"] = timed(
            [*QG, "build", "--checkpoint", str(source), "--targets", args.targets, "--device", args.device,
             "--out", str(built), "--cache-dir", str(args.work / "build-cache")],
            args.out / "build.log", args.step_timeout,
        )  # fmt: skip
        save()
        return
    for variant, extra in (("resident", []), ("offloaded", ["--max-memory", args.max_memory])):
        out = args.work / f"eval-{variant}"
        step = timed(
            [*QG, "eval", "--checkpoint", str(source), "--artifacts", str(built), "--suites", args.suites,
             "--profile", args.profile, "--fixed", "--device", args.device, "--data-dir", str(args.data),
             "--out", str(out), "--cache-dir", str(args.work / f"cache-{variant}"), *extra],
            args.out / f"eval-{variant}.log", args.step_timeout,
        )  # fmt: skip
        run = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
        step["max_memory"] = run.get("max_memory")
        step["seconds_inside"] = run.get("seconds")
        step["numerics"] = {
            m: {k: n.get(k) for k in ("mode", "device", "offloaded_layers")}
            for m, n in run.get("numerics", {}).items()
        }
        results[f"eval_{variant}"] = step
        save()
    one, two = (_records(args.work / f"eval-{v}") for v in ("resident", "offloaded"))
    results["same_records"] = {k: one[k] == two.get(k) for k in one}
    results["windows"] = {k: len(v) for k, v in one.items()}
    summaries = [args.work / f"eval-{v}" / "summary.json" for v in ("resident", "offloaded")]
    if all(s.exists() for s in summaries):
        a, b = (json.loads(s.read_text()) for s in summaries)
        results["summary_resident"], results["same_summary"] = a, a == b
    save()
    print(json.dumps({k: v for k, v in results.items() if k != "summary_resident"}, indent=1))


if __name__ == "__main__":
    main()
