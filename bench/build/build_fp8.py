"""hopper-fp8 build of a synthetic multi-shard Llama against llm-compressor's own FP8 paths.

Usage:  .venv/bin/python bench/build/build_fp8.py [--layers 28] [--repeats 3] [--workdir DIR] [--out F]

Writes a random bf16 Llama (default: 28 layers of hidden 2048, about 3.1 GB in 4 shards of at
most 830 MB, 1.57 B parameters) under ``--workdir``, then measures in this run:

- the disk: raw read of the checkpoint's shards from a cold cache, raw write (with fdatasync)
  of as many bytes as the FP8 artifact has;
- each contender in its own process, alternating across ``--repeats`` rounds, with wall time
  and peak RSS (the child's ``VmHWM``, polled from outside), the checkpoint's pages dropped
  from the page cache before every run (``posix_fadvise(DONTNEED)`` on its files only, so other
  work on the machine keeps its cache) and the output flushed (``sync``, timed apart) and
  deleted after every run, so no run pays for another's dirty pages:
    anchors:  ``oneshot`` (load the model, FP8_DYNAMIC, ``save_pretrained`` compressed) and
              ``model_free_ptq`` (one worker, as the engine it replaces ran it);
    steps:    ``plain loop`` (per shard: ``load_file``, quantize each weight, ``save_file``),
              ``stream_fp8`` with 1 worker and no readahead (positioned reads and writes, no
              shard in memory), with the default workers (reading, computing and writing of
              different tensors overlap), with kernel readahead ahead of the workers too but
              a quantization_config not yet cached (a fresh cache: compressed-tensors is
              imported), and as shipped;
    CLI:      ``quantgate build --targets hopper-fp8`` (intake: validation, a NaN/Inf scan and
              a sha256 of every source file, the build, and the manifest's sha256 of every
              output file), once with intake's stat cache emptied first (a checkpoint seen for
              the first time) and once as every later step of a run sees it (cache filled);
- the artifact: ``stream_fp8``'s output against ``model_free_ptq``'s and ``oneshot``'s (scales,
  FP8 codes, names, shapes, dtypes, ``quantization_config``).

Medians are reported with ratios to the faster anchor (of the medians, and the median of the
ratios paired within each round); the figures go to stdout as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from quantgate.runtime.units import GB, MB

# synthetic checkpoints are test support (tests/support/models.py), outside the product
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
IGNORE = ["lm_head", "re:.*embed_tokens$", "re:.*\\.gate$", "re:.*shared_expert_gate$", "re:.*router$"]
CONTENDERS = [
    "oneshot",
    "model_free_ptq",
    "plain_loop",
    "stream_fp8_1",
    "stream_fp8_no_readahead",
    "stream_fp8_cold_config",
    "stream_fp8",
    "quantgate_build_first_intake",
    "quantgate_build",
]
ANCHORS = ("oneshot", "model_free_ptq")


# ---- contenders, each run in a fresh process: python bench/build/build_fp8.py --child NAME SRC DST ----


def _oneshot(src: Path, dst: Path) -> None:
    import torch

    from quantgate.quantize.engines._logs import quiet

    quiet()
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme="FP8_DYNAMIC", ignore=IGNORE))
    model.save_pretrained(dst, save_compressed=True)
    AutoTokenizer.from_pretrained(src).save_pretrained(dst)


def _model_free_ptq(src: Path, dst: Path) -> None:
    from quantgate.quantize.engines._logs import quiet

    quiet()
    from llmcompressor import model_free_ptq

    model_free_ptq(src, dst, scheme="FP8_DYNAMIC", ignore=IGNORE, max_workers=1, device="cpu")


def _plain_loop(src: Path, dst: Path) -> None:
    """The obvious streaming build: a whole shard in, quantized in memory, a whole shard out."""
    import torch
    from compressed_tensors.utils.match import match_quantizable_tensors
    from safetensors.torch import load_file, save_file

    from quantgate.quantize.engines.fp8_channel import FP8, quantize_rows
    from quantgate.quantize.engines.fp8_config import quantization_config
    from quantgate.quantize.engines.stream_fp8 import write_metadata

    weight_map, total = {}, 0
    for shard in sorted(src.glob("*.safetensors")):
        tensors = load_file(shard)
        for _, name in list(match_quantizable_tensors(dict(tensors), IGNORE, ["Linear"])):
            weight = tensors.pop(name)
            tensors[name] = torch.empty(weight.shape, dtype=FP8)
            tensors[f"{name}_scale"] = quantize_rows(weight, torch.empty_like(weight), tensors[name])
        save_file(tensors, dst / shard.name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, shard.name))
        total += sum(t.nbytes for t in tensors.values())
        del tensors
    write_metadata(src, dst, quantization_config(IGNORE, quantized=True), weight_map, total)


def _stream(src: Path, dst: Path, workers: int | None, readahead: bool = True) -> None:
    from quantgate.quantize.engines.stream_fp8 import READAHEAD_BYTES, build_fp8

    build_fp8(src, dst, IGNORE, workers=workers, readahead=READAHEAD_BYTES if readahead else 0)


def _child(name: str, src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    if name == "oneshot":
        _oneshot(src, dst)
    elif name == "model_free_ptq":
        _model_free_ptq(src, dst)
    elif name == "plain_loop":
        _plain_loop(src, dst)
    elif name == "stream_fp8_1":
        _stream(src, dst, 1, readahead=False)
    elif name == "stream_fp8_no_readahead":
        _stream(src, dst, None, readahead=False)
    elif name == "stream_fp8_cold_config":  # as shipped, but its quantization_config not cached yet
        os.environ["QUANTGATE_CACHE"] = tempfile.mkdtemp(prefix="quantgate-bench-cold-")
        try:
            _stream(src, dst, None)
        finally:
            shutil.rmtree(os.environ["QUANTGATE_CACHE"], ignore_errors=True)
    elif name == "stream_fp8":
        _stream(src, dst, None)
    else:
        raise SystemExit(f"unknown contender {name}")


# ---- measurement ----


def _drop_from_cache(paths: list[Path]) -> None:
    """Evict these files' pages only (the machine may be shared; drop_caches would evict everyone's)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _sync_tree(root: Path) -> float:
    started = time.perf_counter()
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    return time.perf_counter() - started


def _run(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, int]:
    """Wall seconds and peak RSS (VmHWM polled every 20 ms) of one child process."""
    from quantgate.runtime.memory import peak_rss_bytes

    with tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, **(env or {})}
        )
        peak = 0
        while proc.poll() is None:
            peak = max(peak, peak_rss_bytes(proc.pid) or 0)
            time.sleep(0.02)
        seconds = time.perf_counter() - started
        err.seek(0)
        if proc.returncode:
            raise SystemExit(f"{argv} failed ({proc.returncode}):\n{err.read()[-3000:]}")
    return seconds, peak


def disk_speeds(shards: list[Path], write_bytes: int, scratch: Path) -> dict[str, float]:
    """Cold sequential read of the shards and a synced sequential write, 16 MiB at a time."""
    chunk = 16 * 1024**2
    _drop_from_cache(shards)
    started, read = time.perf_counter(), 0
    buffer = bytearray(chunk)
    for path in shards:
        with open(path, "rb", buffering=0) as fh:
            while n := fh.readinto(buffer):
                read += n
    read_s = time.perf_counter() - started
    block = os.urandom(chunk)
    started = time.perf_counter()
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(max(1, write_bytes // chunk)):
            os.write(fd, block)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    write_s = time.perf_counter() - started
    written = max(1, write_bytes // chunk) * chunk
    scratch.unlink()
    return {"read_GBps": read / read_s / GB, "write_GBps": written / write_s / GB}


def _tensors(artifact: Path) -> dict[str, Path]:
    from quantgate.intake.safetensors_header import read_header

    return {name: shard for shard in artifact.glob("*.safetensors") for name in read_header(shard).tensors}


def _schemes(config: dict | None) -> list[str]:
    return sorted(json.dumps(g, sort_keys=True) for g in (config or {}).get("config_groups", {}).values())


def compare(ours: Path, reference: Path) -> dict[str, object]:
    """Scales and kept tensors equal? FP8 codes equal, and how far apart where not?"""
    import torch
    from safetensors import safe_open

    a, b = _tensors(ours), _tensors(reference)
    out: dict[str, object] = {"same_names": set(a) == set(b)}
    codes = equal_codes = max_step = unequal_other = mismatched_meta = 0
    for name in sorted(set(a) & set(b)):
        with safe_open(a[name], "pt") as fa, safe_open(b[name], "pt") as fb:
            x, y = fa.get_tensor(name), fb.get_tensor(name)
        if (x.dtype, x.shape) != (y.dtype, y.shape):
            mismatched_meta += 1
        elif x.dtype == torch.float8_e4m3fn:
            u, v = (t.view(torch.uint8).to(torch.int16) for t in (x, y))
            u, v = (torch.where(t >= 128, -(t - 128), t) for t in (u, v))  # position on the e4m3 grid
            codes += u.numel()
            equal_codes += int((u == v).sum())
            max_step = max(max_step, int((u - v).abs().max()))
        elif not torch.equal(x, y):
            unequal_other += 1
    qa = json.loads((ours / "config.json").read_text()).get("quantization_config")
    qb = json.loads((reference / "config.json").read_text()).get("quantization_config")
    out.update(
        fp8_elements=codes,
        codes_equal_fraction=equal_codes / codes if codes else None,
        max_code_distance=max_step,
        tensors_with_other_dtype_or_shape=mismatched_meta,
        scales_or_kept_tensors_unequal=unequal_other,
        quantization_config_equal=qa == qb,
        # oneshot names its group "group_0", lists only the modules its ignore list matched and
        # writes an empty sparsity_config: the schemes themselves are what must agree
        schemes_equal=_schemes(qa) == _schemes(qb),
        config_keys_differing=sorted(
            k for k in {*(qa or {}), *(qb or {})} if (qa or {}).get(k) != (qb or {}).get(k)
        ),
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=3, metavar=("NAME", "SRC", "DST"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--workdir", type=Path, default=None, help="where the checkpoint goes (default: a /tmp dir)"
    )
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=5632)
    # 830 MB: the 4 shards (the largest 827 MB) that BENCHMARKS.md measured
    parser.add_argument("--shard-mb", type=int, default=830)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default=",".join(CONTENDERS), help="comma-separated contenders to run")
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint for another run")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    if args.child:
        name, src, dst = args.child
        _child(name, Path(src), Path(dst))
        return

    from support.models import write_large_llama

    work = Path(args.workdir or tempfile.mkdtemp(prefix="quantgate-bench-build-"))
    source = work / "checkpoint"
    if not (source / "config.json").exists():
        write_large_llama(
            source,
            hidden_size=args.hidden,
            intermediate_size=args.intermediate,
            num_hidden_layers=args.layers,
            max_shard_bytes=args.shard_mb * MB,
        )
    shards = sorted(source.glob("*.safetensors"))
    checkpoint_bytes = sum(p.stat().st_size for p in shards)
    largest_shard = max(p.stat().st_size for p in shards)
    contenders = [c for c in args.only.split(",") if c]
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in contenders}
    kept: dict[str, Path] = {}
    artifact_bytes = 0
    disks = []
    try:
        for round_ in range(args.repeats):
            for name in contenders if round_ % 2 == 0 else contenders[::-1]:
                dst = work / f"out-{name}"
                shutil.rmtree(dst, ignore_errors=True)
                _drop_from_cache(shards)
                if name.startswith("quantgate_build"):
                    if name == "quantgate_build_first_intake":  # intake's stat cache empty: scan and hash
                        shutil.rmtree(work / "cache" / "intake", ignore_errors=True)
                    argv = [sys.executable, "-m", "quantgate.cli", "build", "--checkpoint", str(source)]
                    argv += ["--targets", "hopper-fp8", "--out", str(dst)]
                else:
                    argv = [sys.executable, __file__, "--child", name, str(source), str(dst)]
                # the bench's own cache: stream_fp8 keeps its quantization_config there (fp8_config.py),
                # computed by the first run that needs it, and never in the user's cache
                env = {"QUANTGATE_CACHE": str(work / "cache")}
                seconds, peak = _run(argv, env)
                sync_s = _sync_tree(dst)
                runs[name].append({"seconds": seconds, "sync_seconds": sync_s, "peak_rss_bytes": peak})
                if name.startswith("quantgate_build"):  # the build step alone, as its manifest records it
                    from quantgate.contracts.artifact import read_manifest

                    runs[name][-1]["build_step_seconds"] = read_manifest(dst / "hopper-fp8").build.seconds
                print(
                    f"round {round_ + 1} {name}: {seconds:.2f} s (+{sync_s:.2f} s sync), "
                    f"peak {peak / GB:.2f} GB",
                    file=sys.stderr,
                )
                if name == "stream_fp8":
                    artifact_bytes = sum(p.stat().st_size for p in dst.glob("*.safetensors"))
                if round_ == args.repeats - 1 and name in ("oneshot", "model_free_ptq", "stream_fp8"):
                    kept[name] = dst
                else:
                    shutil.rmtree(dst)
            # the write probe writes as many bytes as the artifact has (about half the checkpoint)
            disks.append(disk_speeds(shards, artifact_bytes or checkpoint_bytes // 2, work / "disk-probe"))
            print(f"round {round_ + 1} disk: {disks[-1]}", file=sys.stderr)

        summary: dict[str, dict[str, float]] = {}
        for name, rs in runs.items():
            summary[name] = {
                "median_s": statistics.median(r["seconds"] for r in rs),
                "median_sync_s": statistics.median(r["sync_seconds"] for r in rs),
                "median_peak_rss_GB": statistics.median(r["peak_rss_bytes"] for r in rs) / GB,
                "runs_s": [round(r["seconds"], 2) for r in rs],
                "peaks_GB": [round(r["peak_rss_bytes"] / GB, 3) for r in rs],
                **(
                    {"build_step_s": [r["build_step_seconds"] for r in rs]}
                    if name.startswith("quantgate_build")
                    else {}
                ),
            }
        anchors = [summary[a]["median_s"] for a in ANCHORS if a in summary]
        fastest_anchor = min(anchors) if anchors else None
        present = [a for a in ANCHORS if a in runs]
        for name, s in summary.items():
            s["speedup_vs_faster_anchor"] = fastest_anchor / s["median_s"] if fastest_anchor else None
            if present:  # paired within each round: a load spike slows a whole round, not one side
                per_round = [
                    min(runs[a][i]["seconds"] for a in present) / runs[name][i]["seconds"]
                    for i in range(args.repeats)
                ]
                s["speedup_per_round"] = [round(x, 2) for x in per_round]
                s["median_speedup_per_round"] = statistics.median(per_round)
            s["peak_rss_vs_largest_shard"] = s["median_peak_rss_GB"] * GB / largest_shard
        read_gbps = statistics.median(d["read_GBps"] for d in disks)
        write_gbps = statistics.median(d["write_GBps"] for d in disks)
        floor = checkpoint_bytes / GB / read_gbps + artifact_bytes / GB / write_gbps
        equivalence = {
            ref: compare(kept["stream_fp8"], kept[ref])
            for ref in ANCHORS
            if ref in kept and "stream_fp8" in kept
        }
        result = {
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
            "load_average_at_end": os.getloadavg(),
            "checkpoint": {
                "bytes": checkpoint_bytes,
                "shards": len(shards),
                "largest_shard_bytes": largest_shard,
                "layers": args.layers,
                "hidden": args.hidden,
            },
            "artifact_bytes": artifact_bytes,
            "disk": {"read_GBps": read_gbps, "write_synced_GBps": write_gbps, "raw_io_floor_s": floor},
            "contenders": summary,
            "equivalence_vs": equivalence,
        }
        text = json.dumps(result, indent=2)
        print(text)
        if args.out:
            args.out.write_text(text + "\n")
    finally:
        for dst in kept.values():
            shutil.rmtree(dst, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
