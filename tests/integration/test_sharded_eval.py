"""``quantgate eval --devices 2`` on the CPU: two processes over gloo, the model split by its
tensor-parallel plan, give the records one process gives (issue 29).

Not bit for bit, and the test says by how much, from what a tensor-parallel pass changes: the
row-wise layers' partial products are summed in bf16 across the ranks (the source's per-window
NLL moves by bf16 rounding, about 1e-5 relative here), and a per-token FP8 activation scale is
taken over a rank's slice of the features, as vLLM's row-parallel FP8 layers take it. A wrong cut
or a missing all-reduce moves perplexity by orders of magnitude more (a halved residual stream).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantgate.calibration import build_set, load_spec
from quantgate.config.gates import load_gates
from quantgate.intake import intake
from support.builds import build_targets
from support.cli import quantgate

pytestmark = pytest.mark.integration

TARGETS = ["hopper-fp8", "blackwell-nvfp4"]  # per-token FP8 and per-16-group NVFP4 activations


def _one_and_two_processes(base: Path, kind: str, catalog, repo_root) -> dict[int, Path]:
    """A tiny ``kind`` model (4 heads, 2 KV heads: splits over 2) built for both targets, evaluated
    by the command line with one process and with two."""
    from support.models import write_tiny_model

    source = write_tiny_model(base / f"tiny-{kind}", kind)
    record = intake(source, load_gates(repo_root / "gates.yaml", catalog))
    calibration = build_set(load_spec(repo_root / "calibration_sets" / "default.yaml"))  # FP8 KV scales
    build_targets(record, TARGETS, base / "artifacts", catalog, calibration)
    outs = {}
    for processes in (1, 2):
        out = base / f"eval-{processes}"
        run = quantgate(
            "eval",
            "--checkpoint",
            str(source),
            "--artifacts",
            str(base / "artifacts"),
            "--out",
            str(out),
            "--suites",
            "wikitext",
            "--fixed",  # every window, so that the two runs are paired item by item
            "--devices",
            str(processes),
            env={"OMP_NUM_THREADS": "1"},
        )
        assert run.returncode == 0, run.stderr[-3000:]
        assert "summary.json" in run.stdout  # the summary is printed once, by rank 0
        assert run.stdout.count("results:") == 1
        outs[processes] = out
    return outs


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory, catalog, repo_root) -> dict[int, Path]:
    return _one_and_two_processes(tmp_path_factory.mktemp("sharded"), "llama", catalog, repo_root)


@pytest.fixture(scope="module")
def evaluated_moe(tmp_path_factory, catalog, repo_root) -> dict[int, Path]:
    """Mixtral's plan shards its experts (``moe_tp_experts``): every expert's gate/up column-wise and
    down row-wise on each rank, the layer's output summed over the ranks, as vLLM's TP fused MoE."""
    return _one_and_two_processes(tmp_path_factory.mktemp("sharded-moe"), "mixtral", catalog, repo_root)


def _records(out: Path, model: str) -> list[dict]:
    return json.loads((out / model / "wikitext.json").read_text())["samples"]


def test_two_processes_record_that_they_ran_tensor_parallel(evaluated):
    one = json.loads((evaluated[1] / "run.json").read_text())
    two = json.loads((evaluated[2] / "run.json").read_text())
    assert one["shards"] is None
    assert two["shards"] == {
        "processes": 2,
        "backend": "gloo",
        "engine": "transformers tp_plan under torch.distributed.run",
    }
    # a reference computed over two processes is its own cache entry, not one process's
    assert two["reference_cache"]["computed"] == ["wikitext"]
    for model in ("source", *TARGETS):
        assert two["numerics"][model]["tensor_parallel"] == 2
        assert one["numerics"][model]["tensor_parallel"] == 1
    assert any("tensor parallel over 2 processes" in n for n in two["numerics"]["hopper-fp8"]["notes"])


def test_rank_zero_alone_writes_the_results(evaluated):
    listing = {p.relative_to(evaluated[2]) for p in evaluated[2].rglob("*")}
    assert listing == {p.relative_to(evaluated[1]) for p in evaluated[1].rglob("*")}


@pytest.mark.parametrize("kind", ["llama", "mixtral"])
def test_two_processes_give_one_process_records(kind, request):
    evaluated = request.getfixturevalue("evaluated" if kind == "llama" else "evaluated_moe")
    for model in ("source", *TARGETS):
        one, two = _records(evaluated[1], model), _records(evaluated[2], model)
        assert [(r["item"], r["tokens"]) for r in one] == [(r["item"], r["tokens"]) for r in two]
        for a, b in zip(one, two, strict=True):
            # a window is 63 scored tokens at smoke: one flipped FP4 rounding moves its sum by a
            # few 1e-4 (3.4e-4 measured, NVFP4); the summary over 128 windows holds 2e-4 below
            assert b["nll_sum"] == pytest.approx(a["nll_sum"], rel=1e-3), model
    summary = {n: json.loads((evaluated[n] / "summary.json").read_text()) for n in (1, 2)}
    for model in TARGETS:
        a, b = summary[1][model], summary[2][model]
        assert b["wikitext.perplexity"] == pytest.approx(a["wikitext.perplexity"], rel=2e-4)
        assert b["wikitext.kld_mean"] == pytest.approx(a["wikitext.kld_mean"], rel=0.05)
        assert abs(b["wikitext.top1_agreement"] - a["wikitext.top1_agreement"]) <= 0.01


def test_a_moe_artifact_over_two_processes_cuts_its_emulated_experts(evaluated_moe):
    run = json.loads((evaluated_moe[2] / "run.json").read_text())
    for model in TARGETS:
        numerics = run["numerics"][model]
        assert numerics["moe_layers"] == 2 and numerics["tensor_parallel"] == 2, model
        # the tiny mixtral's 128 intermediate features, half on each rank
        assert any("each holding every expert's slice of 64 intermediate" in n for n in numerics["notes"]), (
            model
        )
