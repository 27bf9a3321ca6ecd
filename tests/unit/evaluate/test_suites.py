"""Suite specs as data, the evaluation data boundary, and the scoring identities."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from quantgate.declarations import DataSource
from quantgate.evaluate.data import DataDir, MissingDataError, load_text
from quantgate.evaluate.suites import EvalContext, load_suite, load_suites
from quantgate.evaluate.suites.long_chain import accepted_per_step, first_divergence
from quantgate.runtime.errors import ConfigFileError, UsageError
from support.servers import free_port

pytestmark = pytest.mark.unit


def test_every_shipped_suite_validates(repo_root):
    suites = load_suites(repo_root / "eval_suites")
    kinds = {s.spec.kind for s in suites}
    assert {"text", "gsm8k", "humaneval", "long_chain", "domain"} <= kinds
    for suite in suites:
        assert suite.spec.sizes("smoke") and suite.spec.sizes("full")


def test_a_typo_names_the_line_and_the_nearest_key(repo_root, tmp_path):
    text = (repo_root / "eval_suites" / "wikitext.yaml").read_text().replace("top_k:", "topk:")
    path = tmp_path / "wikitext.yaml"
    path.write_text(text)
    with pytest.raises(ConfigFileError) as info:
        load_suite(path)
    line = next(n for n, l in enumerate(text.splitlines(), 1) if l.startswith("topk:"))
    assert f"wikitext.yaml:{line}" in str(info.value) and "did you mean 'top_k'" in str(info.value)


def test_unknown_suite_and_kind_are_refused(repo_root, tmp_path):
    with pytest.raises(UsageError, match="did you mean 'gsm8k'"):
        load_suites(repo_root / "eval_suites", ["gsm8"])
    path = tmp_path / "x.yaml"
    path.write_text("name: x\nkind: txt\n")
    with pytest.raises(ConfigFileError, match="did you mean 'text'"):
        load_suite(path)


def test_missing_data_names_the_file_and_every_place_searched(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data = DataDir((tmp_path / "a", tmp_path / "b"))
    with pytest.raises(MissingDataError) as info:
        load_text(data, DataSource(local="wikitext-2-raw/wiki.test.raw", hub={"path": "wikitext"}))
    message = str(info.value)
    assert "wiki.test.raw" in message and str(tmp_path / "a") in message and str(tmp_path / "b") in message
    assert "--data-dir" in message


@pytest.mark.heavy
def test_missing_data_with_the_hub_unreachable_is_bad_input_naming_the_data_dir(tmp_path, monkeypatch):
    """A build machine without the hub and without the data: exit 2 and where to put the data, not
    a transient error that no retry can fix (HF_ENDPOINT: a loopback port nothing listens on)."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    data = DataDir((tmp_path / "a",))
    with pytest.raises(MissingDataError) as info:
        load_text(data, DataSource(local="wikitext-2-raw/wiki.test.raw", hub={"path": "wikitext"}))
    message = str(info.value)
    assert info.value.exit_code == 2
    assert "wiki.test.raw" in message and str(tmp_path / "a") in message
    assert "the hub could not provide wikitext" in message and "--data-dir" in message


def test_a_changed_data_file_is_refused(tmp_path):
    (tmp_path / "c.txt").write_text("original")
    good = hashlib.sha256(b"original").hexdigest()
    data = DataDir((tmp_path,))
    assert load_text(data, DataSource(local="c.txt", sha256=good)) == "original"
    (tmp_path / "c.txt").write_text("edited")
    with pytest.raises(MissingDataError, match="differs from the expected"):
        load_text(data, DataSource(local="c.txt", sha256=good))


def test_speculative_acceptance_and_first_divergence():
    assert accepted_per_step([True] * 10, 4) == pytest.approx(5.0)  # k accepted + 1 from the target
    assert accepted_per_step([False] * 10, 4) == pytest.approx(1.0)
    assert accepted_per_step([True, False] * 6, 4) == pytest.approx(2.0)
    assert first_divergence([1, 2, 3], [1, 2, 3]) == 3
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2, 3], [1]) == 1


def _text_suite(tmp_path: Path):
    corpus = " ".join(f"The number {i} follows {i - 1} and precedes {i + 1}." for i in range(400))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "corpus.txt").write_text(corpus)
    spec = tmp_path / "tiny-text.yaml"
    spec.write_text(
        "name: tiny-text\nkind: text\ndescription: t\ndata: {local: corpus.txt}\n"
        "profiles: {smoke: {tokens: 256, seq_len: 64, batch_size: 2}, full: {tokens: 512, seq_len: 64}}\n"
        "metrics: [perplexity, kld_mean, kld_p99, top1_agreement]\n"
    )
    return load_suite(spec), EvalContext("smoke", DataDir((tmp_path / "data",)), tmp_path, tmp_path / "cache")


def test_source_scored_against_itself_gives_zero_kld_and_full_agreement(tiny_llama, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    suite, ctx = _text_suite(tmp_path)
    model = SimpleNamespace(
        model=AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.bfloat16).eval(),
        tokenizer=AutoTokenizer.from_pretrained(tiny_llama),
    )
    reference, source_result = suite.runner.reference(ctx, model)
    again = suite.runner.score(ctx, model, reference)
    for result in (source_result, again):
        assert result.metrics["kld_mean"] == 0.0 and result.metrics["kld_p99"] == 0.0
        assert result.metrics["top1_agreement"] == 1.0
        assert result.metrics["tokens"] == 4 * 63
    assert again.metrics["perplexity"] == pytest.approx(source_result.metrics["perplexity"])

    # a perturbed model is measurably different from the source
    with torch.no_grad():
        model.model.model.layers[0].mlp.down_proj.weight.mul_(1.5)
    moved = suite.runner.score(ctx, model, reference)
    assert (
        moved.metrics["kld_mean"] > 0 and moved.metrics["perplexity"] != source_result.metrics["perplexity"]
    )


def test_humaneval_never_imports_lm_evals_unsandboxed_execution(repo_root):
    """lm-eval's humaneval utils.py loads and runs `code_eval` at import: it must never load."""
    import sys

    suite = load_suite(repo_root / "eval_suites" / "humaneval.yaml")
    config = suite.runner._config()
    assert config["metric_list"] == [{"metric": "bypass"}] and config["unsafe_code"] is False
    assert "lm_eval.tasks.humaneval.utils" not in sys.modules
    assert not any("code_eval" in name for name in sys.modules)
