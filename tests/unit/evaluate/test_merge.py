"""Per-artifact evaluations merge into one directory the gate reads, and only if they pair."""

from __future__ import annotations

import json

import pytest

from quantgate.evaluate.merge import merge_evaluations
from quantgate.runtime.errors import InputError

pytestmark = pytest.mark.unit


def _part(root, name, models, profile="smoke", passes=0, threads="2"):
    part = root / name
    for model in models:
        (part / model).mkdir(parents=True)
        (part / model / "wikitext.json").write_text(json.dumps({"model": model}))
    (part / "summary.json").write_text(
        json.dumps({m: {"wikitext.kld_mean": 0.1 * i} for i, m in enumerate(models)})
    )
    (part / "run.json").write_text(
        json.dumps(
            {
                "model": "m",
                "model_class": "draft",
                "profile": profile,
                "source_hash": "ab",
                "suites": {"wikitext": {"kind": "perplexity", "spec_sha256": "ab12"}},
                "bytes": {m: 10 for m in models},
                "numerics": {m: {"mode": "emulated"} for m in models},
                "reference_cache": {
                    "hits": ["wikitext"] if not passes else [],
                    "computed": ["wikitext"] if passes else [],
                },
                "source_forward_passes": passes,
                "environment": {"compile": "auto", "threads": threads, "cpu": "avx2,fma"},
            }
        )
    )
    return part


def test_parts_merge_into_one_evaluation(tmp_path):
    parts = [
        _part(tmp_path, "source", ["source"], passes=8),
        _part(tmp_path, "fp8", ["source", "hopper-fp8"]),
        _part(tmp_path, "int4", ["source", "draft-int4"]),
    ]
    out = merge_evaluations(parts, tmp_path / "eval")
    assert set(json.loads((out / "summary.json").read_text())) == {"source", "hopper-fp8", "draft-int4"}
    assert {p.name for p in out.iterdir() if p.is_dir()} == {"source", "hopper-fp8", "draft-int4"}
    run = json.loads((out / "run.json").read_text())
    assert run["source_forward_passes"] == 8  # the source ran once, in the reference part
    assert set(run["numerics"]) == {"source", "hopper-fp8", "draft-int4"}


def test_a_stale_artifact_is_not_kept_by_a_later_merge(tmp_path):
    merge_evaluations([_part(tmp_path, "a", ["source", "old-target"])], tmp_path / "eval")
    out = merge_evaluations([_part(tmp_path, "b", ["source", "hopper-fp8"])], tmp_path / "eval")
    assert not (out / "old-target").exists()


def test_parts_from_another_profile_are_refused_naming_the_part(tmp_path):
    parts = [
        _part(tmp_path, "source", ["source"]),
        _part(tmp_path, "fp8", ["source", "hopper-fp8"], profile="full"),
    ]
    with pytest.raises(InputError, match="profile") as caught:
        merge_evaluations(parts, tmp_path / "eval")
    assert str(tmp_path / "fp8" / "run.json") in str(caught.value)


def test_parts_evaluated_under_other_numerics_switches_are_refused(tmp_path):
    """A source reference from a 2-thread process paired with an artifact scored on 4 threads would
    report the reduction-order difference as quantization error."""
    parts = [
        _part(tmp_path, "source", ["source"]),
        _part(tmp_path, "fp8", ["source", "hopper-fp8"], threads="4"),
    ]
    with pytest.raises(InputError, match="environment") as caught:
        merge_evaluations(parts, tmp_path / "eval")
    assert "numerics switches" in str(caught.value)
