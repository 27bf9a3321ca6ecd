"""The evaluation runner on tiny artifacts: paired results, numerics recorded, source run once."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from quantgate.calibration import build_set, load_spec
from quantgate.config.gates import load_gates
from quantgate.config.targets import Catalog
from quantgate.evaluate.data import DataDir
from quantgate.evaluate.runner import evaluate
from quantgate.evaluate.suites import EvalContext, load_suite
from quantgate.intake import intake
from quantgate.runtime.errors import InputError
from support.builds import build_targets
from support.models import write_tiny_model

pytestmark = pytest.mark.unit


@pytest.fixture
def setup(tiny_llama, tmp_path, catalog, repo_root):
    record = intake(tiny_llama, load_gates(repo_root / "gates.yaml", catalog))
    # the FP8 KV scales are calibrated on it
    calibration = build_set(load_spec(repo_root / "calibration_sets" / "default.yaml"))
    build_targets(record, ["hopper-fp8", "rocm-cdna3-fp8"], tmp_path / "artifacts", catalog, calibration)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "corpus.txt").write_text(
        " ".join(f"Item {i} comes after item {i - 1}." for i in range(300))
    )
    spec = tmp_path / "suites" / "tiny-text.yaml"
    spec.parent.mkdir()
    spec.write_text(
        "name: tiny-text\nkind: text\ndescription: t\ndata: {local: corpus.txt}\n"
        "profiles: {smoke: {tokens: 256, seq_len: 64, batch_size: 2}, full: {tokens: 512, seq_len: 64}}\n"
        "metrics: [perplexity, kld_mean, kld_p99, top1_agreement]\n"
    )
    ctx = EvalContext("smoke", DataDir((tmp_path / "data",)), repo_root, tmp_path / "cache")
    return record, [load_suite(spec)], ctx


def test_the_source_reference_is_computed_once_and_reused(setup, tmp_path):
    record, suites, ctx = setup
    source = Path(record.path)
    first = evaluate(source, record.content_hash, tmp_path / "artifacts", tmp_path / "e1", suites, ctx)
    assert (
        first.source_forward_passes == 2
    )  # 4 windows at batch 2, once: its own scores come from the reference
    second = evaluate(source, record.content_hash, tmp_path / "artifacts", tmp_path / "e2", suites, ctx)
    assert second.source_forward_passes == 0
    assert second.reference_hits == ["tiny-text"]
    assert first.summary == second.summary

    summary = json.loads((tmp_path / "e1" / "summary.json").read_text())
    assert summary["source"]["tiny-text.kld_mean"] == 0.0
    assert summary["source"]["tiny-text.top1_agreement"] == 1.0
    assert summary["hopper-fp8"]["tiny-text.kld_mean"] > 0
    assert summary["rocm-cdna3-fp8"]["tiny-text.kld_mean"] != summary["hopper-fp8"]["tiny-text.kld_mean"]
    record_file = json.loads((tmp_path / "e1" / "hopper-fp8" / "tiny-text.json").read_text())
    assert record_file["numerics"]["mode"] == "emulated"
    assert record_file["numerics"]["activations"] == "fp8_e4m3fn_per_token"
    assert len(record_file["samples"]) == 4


def test_run_json_says_where_the_time_went(setup, tmp_path):
    """Issue 27: a GPU worker's operator sees load, reference and scoring time per model (the
    source is loaded once, and only when its reference is not cached)."""
    record, suites, ctx = setup
    source = Path(record.path)
    evaluate(source, record.content_hash, tmp_path / "artifacts", tmp_path / "e1", suites, ctx)
    evaluate(source, record.content_hash, tmp_path / "artifacts", tmp_path / "e2", suites, ctx)
    first = json.loads((tmp_path / "e1" / "run.json").read_text())["seconds"]
    again = json.loads((tmp_path / "e2" / "run.json").read_text())["seconds"]
    assert set(first) == {"source", "hopper-fp8", "rocm-cdna3-fp8"}
    assert set(first["source"]) == {"load", "reference:tiny-text"}
    assert set(again["source"]) == {"reference:tiny-text"}  # from the cache: the source never loaded
    for target in ("hopper-fp8", "rocm-cdna3-fp8"):
        assert set(first[target]) == {"verify", "load", "tiny-text"}
        assert all(v >= 0 for v in first[target].values())
    assert first["source"]["load"] > 0 and first["hopper-fp8"]["tiny-text"] > 0


def test_artifacts_of_another_source_are_refused(setup, tmp_path):
    _, suites, ctx = setup
    policy = load_gates(ctx.project_root / "gates.yaml", Catalog(ctx.project_root))
    other = intake(write_tiny_model(tmp_path / "other", "llama", seed=7), policy)
    with pytest.raises(InputError, match="different source checkpoint"):
        evaluate(Path(other.path), other.content_hash, tmp_path / "artifacts", tmp_path / "e", suites, ctx)
    assert not (tmp_path / "e").exists()


_EVALUATE_IN_A_NEW_PROCESS = """
import sys
from pathlib import Path
from quantgate.evaluate.data import DataDir
from quantgate.evaluate.runner import evaluate
from quantgate.evaluate.suites import EvalContext, load_suite

source, artifacts, out, spec, data, root, cache = map(Path, sys.argv[1:8])
ctx = EvalContext("smoke", DataDir((data,)), root, cache)
evaluate(source, sys.argv[8], artifacts, out, [load_suite(spec)], ctx)
"""


@pytest.mark.heavy
def test_two_evaluations_in_separate_processes_write_identical_results(setup, tmp_path, repo_root):
    """Each process computes its own source reference (its own cache) and scores both artifacts:
    every result file, summary.json included, is the same bytes."""
    import subprocess
    import sys

    record, suites, _ = setup
    for run in ("a", "b"):
        subprocess.run(
            [
                sys.executable,
                "-c",
                _EVALUATE_IN_A_NEW_PROCESS,
                record.path,
                str(tmp_path / "artifacts"),
                str(tmp_path / f"e-{run}"),
                str(suites[0].path),
                str(tmp_path / "data"),
                str(repo_root),
                str(tmp_path / f"cache-{run}"),
                record.content_hash,
            ],
            check=True,
            capture_output=True,
        )
    a, b = tmp_path / "e-a", tmp_path / "e-b"
    written = sorted(p.relative_to(a) for p in a.rglob("*.json") if p.name != "run.json")
    assert len(written) == 4  # summary + source, hopper-fp8, rocm-cdna3-fp8
    for rel in written:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    environment = json.loads((a / "run.json").read_text())["environment"]
    assert environment == json.loads((b / "run.json").read_text())["environment"]
    assert {"compile", "threads", "cpu", "kernels", "torch_threads"} <= set(environment)


def test_the_reference_cache_is_keyed_by_the_numerics_switches(setup, monkeypatch):
    """A reference computed with other threads or another compile setting is not paired with this run."""
    from quantgate.evaluate.runner import reference_path

    record, suites, ctx = setup
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    one = reference_path(ctx, suites[0], record.content_hash)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert reference_path(ctx, suites[0], record.content_hash) != one
    monkeypatch.setenv("QUANTGATE_COMPILE", "0")
    assert len({one, reference_path(ctx, suites[0], record.content_hash)}) == 2


def test_capped_cpu_kernels_are_another_switch():
    """ATEN_CPU_CAPABILITY=avx2 on an AVX-512 machine runs other kernels: a fresh process says so."""
    import subprocess
    import sys

    code = "from quantgate.evaluate import environment; print(environment.switches()['kernels'])"
    capped = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "ATEN_CPU_CAPABILITY": "avx2"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert capped.stdout.strip() == "AVX2"


def test_run_json_and_every_result_say_where_the_models_ran(setup, tmp_path):
    """Issue 27 item 1: run.json records the device (--device), each artifact's numerics label every
    quantized linear (emulated on the CPU), and a GPU reference is never paired with a CPU run."""
    from quantgate.contracts.results import read_evaluation
    from quantgate.evaluate.runner import reference_path

    record, suites, ctx = setup
    evaluate(Path(record.path), record.content_hash, tmp_path / "artifacts", tmp_path / "e", suites, ctx)
    run = read_evaluation(tmp_path / "e").run
    assert run is not None and run.device == "cpu"
    linears = run.numerics["hopper-fp8"]["linears"]
    assert linears and set(linears.values()) == {"emulated"}
    assert run.numerics["source"]["device"] == "cpu"
    cpu = reference_path(ctx, suites[0], record.content_hash)
    assert cpu == reference_path(ctx, suites[0], record.content_hash, "cpu")  # older CPU keys stay valid
    assert reference_path(ctx, suites[0], record.content_hash, "cuda") != cpu


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_on_the_gpu_run_json_says_cuda_and_hopper_runs_native(setup, tmp_path):
    from quantgate.contracts.results import read_evaluation
    from quantgate.numerics.native import native_fp8_device

    record, suites, ctx = setup
    evaluate(
        Path(record.path),
        record.content_hash,
        tmp_path / "artifacts",
        tmp_path / "e",
        suites,
        ctx,
        device="cuda",
    )
    run = read_evaluation(tmp_path / "e").run
    assert run is not None and run.device == "cuda"
    hopper, rocm = run.numerics["hopper-fp8"], run.numerics["rocm-cdna3-fp8"]
    assert hopper["device"] == rocm["device"] == "cuda"
    if native_fp8_device("cuda"):
        assert hopper["mode"] == "native" and set(hopper["linears"].values()) == {"native"}
    assert rocm["mode"] == "emulated" and set(rocm["linears"].values()) == {"emulated"}  # fnuz: emulated
