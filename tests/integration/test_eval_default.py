"""`quantgate eval` on the default model and its four artifacts at the smoke profile."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TARGETS = ["hopper-fp8", "rocm-cdna3-fp8", "blackwell-nvfp4", "draft-int4"]


def test_eval_scores_every_artifact_in_its_numerics(default_model, default_artifacts, run_cli, tmp_path):
    artifacts, _ = default_artifacts
    out = tmp_path / "eval"
    run = run_cli("eval", "--checkpoint", str(default_model), "--artifacts", str(artifacts), "--out", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "summary.json" in run.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"source", *TARGETS}

    source = summary["source"]
    for suite in ("wikitext", "traffic", "long-chain"):
        assert source[f"{suite}.kld_mean"] == 0.0
        assert source[f"{suite}.top1_agreement"] == 1.0
    assert source["gsm8k.flip_rate"] == 0.0 and source["humaneval.flip_rate"] == 0.0

    for target in TARGETS:
        metrics = summary[target]
        for key in (
            "wikitext.perplexity", "wikitext.kld_mean", "wikitext.kld_p99", "wikitext.top1_agreement",
            "traffic.perplexity", "gsm8k.accuracy", "gsm8k.flip_rate", "humaneval.pass_at_1",
            "humaneval.flip_rate", "long-chain.agreement_bin1", "long-chain.agreement_at_depth",
            "long-chain.first_divergence_mean", "long-chain.acceptance_k4", "support-domain.accuracy",
        ):
            assert metrics[key] is not None, f"{target} lacks {key}"
        assert metrics["wikitext.kld_mean"] > 0 and metrics["wikitext.top1_agreement"] < 1
        record = json.loads((out / target / "gsm8k.json").read_text())
        assert len(record["samples"]) == int(record["metrics"]["items"])
        assert record["numerics"]["mode"] == "emulated"

    kld = {t: summary[t]["wikitext.kld_mean"] for t in TARGETS}
    assert kld["blackwell-nvfp4"] > kld["hopper-fp8"] > 0
    assert kld["rocm-cdna3-fp8"] != kld["hopper-fp8"]  # same bytes, different numerics

    meta = json.loads((out / "run.json").read_text())
    assert meta["numerics"]["rocm-cdna3-fp8"]["activations"] == "fp8_e4m3fnuz_per_token"

    # a second evaluation against the same source reuses every reference: the source never runs
    again = run_cli(
        "eval", "--checkpoint", str(default_model), "--artifacts", str(artifacts), "--out", str(tmp_path / "again"),
        "--targets", "hopper-fp8", "--suites", "wikitext,long-chain",
    )
    assert again.returncode == 0, again.stderr[-3000:]
    meta = json.loads((tmp_path / "again" / "run.json").read_text())
    assert meta["source_forward_passes"] == 0
    assert sorted(meta["reference_cache"]["hits"]) == ["long-chain", "wikitext"]
    assert json.loads((tmp_path / "again" / "summary.json").read_text())["hopper-fp8"]["wikitext.kld_mean"] == kld["hopper-fp8"]
