"""``quantgate eval --max-memory``: a model larger than its device's budget is evaluated with its
layers past the budget offloaded, and gives the records a resident model gives (issue 29).

On the CPU the offloaded layers live in memory-mapped files on disk (on a GPU worker, in host
memory); either way accelerate's hooks copy a layer's tensors to the device for its forward and
the same modules compute on them, so the per-window NLL is equal bit for bit, not within a
tolerance. Each run has its own cache, so the source's reference is computed offloaded too.
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

TARGETS = ["hopper-fp8", "blackwell-nvfp4"]  # float32 weights with per-channel and per-group scales
BUDGET = "500kB"  # the tiny llama's head and embeddings (197 kB) and two of its four layers


@pytest.fixture(scope="module")
def built(tmp_path_factory, catalog, repo_root) -> tuple[Path, Path]:
    from support.models import write_tiny_model

    base = tmp_path_factory.mktemp("offload")
    source = write_tiny_model(base / "tiny-llama", "llama", num_hidden_layers=4)
    record = intake(source, load_gates(repo_root / "gates.yaml", catalog))
    calibration = build_set(load_spec(repo_root / "calibration_sets" / "default.yaml"))
    build_targets(record, TARGETS, base / "artifacts", catalog, calibration)
    return source, base / "artifacts"


def _eval(built, out: Path, *extra: str):
    source, artifacts = built
    return quantgate(
        "eval",
        "--checkpoint",
        str(source),
        "--artifacts",
        str(artifacts),
        "--out",
        str(out),
        "--suites",
        "wikitext",
        "--fixed",
        "--cache-dir",
        str(out.parent / f"{out.name}-cache"),
        *extra,
        env={"OMP_NUM_THREADS": "1"},
    )


@pytest.fixture(scope="module")
def evaluated(built, tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("offload-evals")
    outs = {}
    for name, extra in (("resident", ()), ("offloaded", ("--max-memory", BUDGET))):
        run = _eval(built, base / name, *extra)
        assert run.returncode == 0, run.stderr[-3000:]
        outs[name] = base / name
    return outs


def test_offloaded_layers_give_the_resident_records_bit_for_bit(evaluated):
    for model in ("source", *TARGETS):
        one, two = (
            json.loads((evaluated[k] / model / "wikitext.json").read_text())["samples"]
            for k in ("resident", "offloaded")
        )
        assert [(r["item"], r["tokens"], r["nll_sum"]) for r in one] == [
            (r["item"], r["tokens"], r["nll_sum"]) for r in two
        ], model
    summary = {k: json.loads((evaluated[k] / "summary.json").read_text()) for k in evaluated}
    assert summary["offloaded"] == summary["resident"]


def test_run_json_says_how_many_layers_each_model_kept_off_the_device(evaluated):
    resident = json.loads((evaluated["resident"] / "run.json").read_text())
    offloaded = json.loads((evaluated["offloaded"] / "run.json").read_text())
    assert resident["max_memory"] is None and offloaded["max_memory"] == 500_000
    for model in ("source", *TARGETS):
        assert resident["numerics"][model].get("offloaded_layers", 0) == 0
        # the budget holds some layers of each model and not all: both paths ran
        assert 0 < offloaded["numerics"][model]["offloaded_layers"] < 4, model
    assert any(
        "decoder layers kept in memory-mapped files on disk" in n
        for n in offloaded["numerics"]["hopper-fp8"]["notes"]
    )


def test_a_budget_below_what_must_stay_resident_is_refused_with_the_size_that_would_do(built, tmp_path):
    run = _eval(built, tmp_path / "out", "--max-memory", "100kB")
    assert run.returncode == 2
    assert "--max-memory" in run.stderr and "pass at least" in run.stderr
    assert not (tmp_path / "out" / "summary.json").exists()


def test_a_budget_that_is_not_a_size_is_refused_before_any_work(built, tmp_path):
    run = _eval(built, tmp_path / "out", "--max-memory", "lots")
    assert run.returncode == 2
    assert "--max-memory" in run.stderr and "40GB" in run.stderr
    assert not (tmp_path / "out").exists()
