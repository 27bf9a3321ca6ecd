"""A checkpoint larger than a memory cap builds hopper-fp8 under that cap.

Data-free targets stream shard by shard; this is the property that lets a 600 GB MoE build on
a worker with less RAM than the checkpoint. Peak RSS is measured for the build process alone
and asserted against the cap; no wall-clock time is asserted.
"""

from __future__ import annotations

import pytest
from safetensors import safe_open

from quantgate.contracts.artifact import read_manifest
from quantgate.runtime.units import GB, MB, format_bytes
from support.models import write_large_llama

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_multi_shard_checkpoint_larger_than_the_cap_builds_under_it(tmp_path, run_cli):
    source = write_large_llama(
        tmp_path / "big",
        hidden_size=1536,
        intermediate_size=6144,
        num_hidden_layers=20,
        vocab_size=16000,
        max_shard_bytes=105 * MB,  # 17 shards, the largest 104 MB: as BENCHMARKS.md measured
    )
    shards = sorted(source.glob("*.safetensors"))
    checkpoint_bytes = sum(p.stat().st_size for p in shards)
    largest_shard = max(p.stat().st_size for p in shards)
    cap = int(0.75 * checkpoint_bytes)
    assert len(shards) >= 6 and checkpoint_bytes > 1.4 * GB

    run = run_cli(
        "build", "--checkpoint", str(source), "--targets", "hopper-fp8", "--out", str(tmp_path / "out")
    )
    assert run.returncode == 0, run.stderr[-3000:]
    print(
        f"checkpoint {format_bytes(checkpoint_bytes)} in {len(shards)} shards "
        f"(largest {format_bytes(largest_shard)}); peak RSS {format_bytes(run.peak_rss_bytes)}; "
        f"cap {format_bytes(cap)}"
    )
    assert run.peak_rss_bytes < cap

    artifact = tmp_path / "out" / "hopper-fp8"
    assert read_manifest(artifact).source.params > 600e6
    quantized = 0
    for shard in artifact.glob("*.safetensors"):
        with safe_open(shard, "pt") as f:
            weights = [k for k in f.keys() if k.endswith("proj.weight")]  # noqa: SIM118  safe_open has keys() but is neither iterable nor a container
            assert all(f.get_slice(k).get_dtype() == "F8_E4M3" for k in weights)
            quantized += len(weights)
    assert quantized == 20 * 7  # every projection of every layer
