"""Fleet pull against a plain boto3 download of the same objects from the same S3 endpoint.

Usage:  .venv/bin/python bench/fleet/pull_throughput.py [--mb 200] [--artifact DIR] [--repeats 3] [--out F]

Starts a moto S3 server on loopback, publishes one artifact through ``publish_report`` (an
SQLite MLflow registry whose artifact store is that S3 bucket), then alternates, ``--repeats``
times: the anchor, boto3's ``download_file`` of every object of the version one after the
other (its defaults: multipart ranges with 10 threads per file); and ``quantgate.publish.pull``
into an empty cache (alias resolution, manifest check, parallel download, a sha256 of every
file, atomic install). Then a pull of the same version again, the cache hit. The artifact is
``--artifact`` (e.g. a built ``hopper-fp8``), else ``--mb`` of synthetic shards with a real
manifest. Medians are reported with the ratio measured in this run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from quantgate.runtime.units import MB

# the S3 server is test support (tests/support/servers.py), outside the product
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))


def synthetic_artifact(directory: Path, megabytes: int) -> Path:
    """Shards of random bytes like a safetensors checkpoint's, plus small configs, with a manifest."""
    from support.artifacts import write_synthetic_manifest

    directory.mkdir(parents=True)
    shards = [megabytes * MB * 2 // 5, megabytes * MB * 2 // 5, megabytes * MB // 5]
    for i, size in enumerate(shards):
        with open(directory / f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors", "wb") as fh:
            fh.writelines(os.urandom(MB) for _ in range(size // MB))
    (directory / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    write_synthetic_manifest(directory, "hopper-fp8")
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200, help="size of the synthetic artifact")
    parser.add_argument("--artifact", type=Path, default=None, help="a built artifact directory instead")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args()

    from quantgate.publish import RegistryConfig, publish_report, pull
    from support.servers import TEST_CREDENTIALS, moto_s3

    os.environ.update(TEST_CREDENTIALS)
    with tempfile.TemporaryDirectory(prefix="quantgate-bench-pull-") as tmp_name, moto_s3() as s3:
        tmp = Path(tmp_name)
        artifacts = tmp / "artifacts"
        if args.artifact:
            shutil.copytree(args.artifact, artifacts / "hopper-fp8")
        else:
            synthetic_artifact(artifacts / "hopper-fp8", args.mb)
        (tmp / "gate").mkdir()
        (tmp / "gate" / "report.json").write_text(
            json.dumps(
                {"model": "bench", "exit_code": 0, "approvals": {"hopper-fp8": ["chat"]}, "verdicts": []}
            )
        )
        cfg = RegistryConfig.local(tmp / "registry").model_copy(
            update={"artifact_uri": f"s3://{s3.bucket}/bench", "s3_endpoint_url": s3.url}
        )
        start = time.perf_counter()
        source = publish_report(tmp / "gate" / "report.json", artifacts, cfg).artifacts[0].source
        publish_s = time.perf_counter() - start

        client = s3.client()
        prefix = source.removeprefix(f"s3://{s3.bucket}/") + "/"
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=s3.bucket, Prefix=prefix)["Contents"]]
        total = sum(o["Size"] for o in client.list_objects_v2(Bucket=s3.bucket, Prefix=prefix)["Contents"])

        def anchor() -> float:
            out = Path(tempfile.mkdtemp(dir=tmp))
            begin = time.perf_counter()
            for key in keys:
                target = out / key.removeprefix(prefix)
                target.parent.mkdir(parents=True, exist_ok=True)
                client.download_file(s3.bucket, key, str(target))
            seconds = time.perf_counter() - begin
            shutil.rmtree(out)
            return seconds

        def ours() -> tuple[float, float]:
            cache = Path(tempfile.mkdtemp(dir=tmp))
            begin = time.perf_counter()
            pull("bench", "hopper-fp8", "chat", cfg, cache_dir=cache)
            cold = time.perf_counter() - begin
            begin = time.perf_counter()
            pull("bench", "hopper-fp8", "chat", cfg, cache_dir=cache)
            hit = time.perf_counter() - begin
            shutil.rmtree(cache)
            return cold, hit

        anchor()  # warm-up: imports, connection pools
        runs = {"anchor": [], "pull": [], "hit": []}
        for _ in range(args.repeats):
            runs["anchor"].append(anchor())
            cold, hit = ours()
            runs["pull"].append(cold)
            runs["hit"].append(hit)

    median = {k: statistics.median(v) for k, v in runs.items()}
    figures = {
        "bytes": total,
        "files": len(keys),
        "publish_s": round(publish_s, 2),
        "anchor_boto3_s": round(median["anchor"], 3),
        "pull_cold_s": round(median["pull"], 3),
        "anchor_MBps": round(total / MB / median["anchor"], 1),
        "pull_MBps": round(total / MB / median["pull"], 1),
        "ratio_pull_over_anchor": round(median["anchor"] / median["pull"], 3),
        "cache_hit_s": round(median["hit"], 4),
        "runs": {k: [round(x, 3) for x in v] for k, v in runs.items()},
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
    }
    print(json.dumps(figures, indent=1))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
