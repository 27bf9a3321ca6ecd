"""Teacher-forced scoring against a direct computation from full log-softmax, per position."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from quantgate.evaluate.scoring import build_reference, score

pytestmark = pytest.mark.unit


def _direct(model, seq: list[int]) -> torch.Tensor:
    """[len-1, vocab] float32 log-probabilities of one unpadded sequence, the textbook way."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([seq])).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1)


def test_measures_equal_the_full_softmax_computation_on_ragged_batches(tiny_llama):
    source = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    other = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    with torch.no_grad():
        other.model.layers[0].mlp.down_proj.weight.mul_(1.5)
    g = torch.Generator().manual_seed(0)
    # lengths that pad within a batch and split across lm_head chunks (300 > 128 positions)
    seqs = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (300, 17, 64, 250, 2)]

    ref = build_reference(source, seqs, k=8, batch_size=3, pad_id=0)
    scores = score(other, seqs, ref, batch_size=3, pad_id=0)

    assert [len(s.nll) for s in scores] == [n - 1 for n in (300, 17, 64, 250, 2)]
    for seq, s, ids, ref_logp, target_logp in zip(
        seqs, scores, ref.topk_ids, ref.topk_logp, ref.target_logp, strict=True
    ):
        p, q = _direct(source, seq), _direct(other, seq)
        targets = torch.tensor(seq[1:])[:, None]
        top = torch.topk(p, k=8, dim=-1)
        torch.testing.assert_close(ids.long(), top.indices)
        torch.testing.assert_close(ref_logp, top.values, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(target_logp, p.gather(1, targets)[:, 0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(s.nll, -q.gather(1, targets)[:, 0], rtol=1e-4, atol=1e-4)
        # KL over the top-8 plus one tail bucket, from the full distributions
        p_top, q_top = top.values.exp(), q.gather(1, top.indices).exp()
        p_tail, q_tail = 1 - p_top.sum(-1), 1 - q_top.sum(-1)
        kl = (p_top * (p_top.log() - q_top.log())).sum(-1) + p_tail * (p_tail.log() - q_tail.log())
        torch.testing.assert_close(s.kld, kl.clamp_min(0), rtol=1e-3, atol=1e-5)
        assert torch.equal(s.agree, q.argmax(-1) == top.indices[:, 0])
    assert torch.cat([s.kld for s in scores]).mean() > 0


def test_the_sources_own_scores_from_its_reference_are_a_scoring_pass_bit_for_bit(tiny_llama):
    """The source is not run a second time to score itself: what the reference holds gives the
    same bits (NLL, KL 0, agreement everywhere)."""
    source = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.bfloat16).eval()
    g = torch.Generator().manual_seed(2)
    seqs = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (300, 17, 64)]
    ref = build_reference(source, seqs, k=8, batch_size=2, pad_id=0)
    passed, own = score(source, seqs, ref, batch_size=2, pad_id=0), ref.own_scores()
    for a, b in zip(passed, own, strict=True):
        assert torch.equal(a.nll, b.nll) and a.nll.dtype == b.nll.dtype
        assert torch.equal(a.kld, b.kld) and torch.equal(a.agree, b.agree)
    assert float(torch.cat([s.nll for s in own]).mean()) > 0


@pytest.mark.heavy
def test_fused_pass_agrees_with_the_eager_one(tiny_llama, monkeypatch):
    """QUANTGATE_COMPILE=1: the decoder's MLP and norms and the log-sum-exp run through
    torch.compile, and the measures are the eager ones to float rounding."""
    from quantgate.evaluate import fusion

    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (200, 90, 200)]
    eager = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    fused = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    monkeypatch.setenv(fusion.ENV, "0")
    ref = build_reference(eager, seqs, k=8, batch_size=2, pad_id=0)
    expected = score(eager, seqs, ref, batch_size=2, pad_id=0)
    monkeypatch.setenv(fusion.ENV, "1")
    got = score(fused, seqs, ref, batch_size=2, pad_id=0)

    assert fused.model.layers[0].mlp._compiled_call_impl is not None
    assert eager.model.layers[0].mlp._compiled_call_impl is None
    for a, b in zip(expected, got, strict=True):
        torch.testing.assert_close(b.nll, a.nll, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(b.kld, a.kld, rtol=1e-3, atol=1e-5)

    # the decision is per pass: the same model, a short pass under auto, runs eagerly again
    monkeypatch.setenv(fusion.ENV, "auto")
    short = score(fused, seqs, ref, batch_size=2, pad_id=0)
    assert fused.model.layers[0].mlp._compiled_call_impl is None
    for a, b in zip(expected, short, strict=True):
        assert torch.equal(b.nll, a.nll)


def test_compile_setting_auto_waits_for_long_passes_and_typos_are_refused(monkeypatch):
    from quantgate.evaluate import fusion
    from quantgate.runtime.errors import UsageError

    monkeypatch.delenv(fusion.ENV, raising=False)
    assert not fusion.wanted(4096)  # every smoke suite runs eagerly
    monkeypatch.setenv(fusion.ENV, "0")
    assert not fusion.wanted(10**9)
    monkeypatch.setenv(fusion.ENV, "yes")
    with pytest.raises(UsageError, match=r"\$QUANTGATE_COMPILE.*use 1 .*0 .*auto"):
        fusion.wanted(4096)


def test_a_gpu_pass_compiles_only_when_asked_and_scores_its_head_in_large_chunks(monkeypatch):
    """Issue 27: on a GPU, auto runs eagerly (compiling cost more than the elementwise work it
    fused) and the head takes thousands of rows at a time; the CPU keeps its measured choices."""
    from quantgate.evaluate import fusion
    from quantgate.evaluate.scoring import chunk_rows

    monkeypatch.delenv(fusion.ENV, raising=False)
    monkeypatch.setattr(fusion, "_have_compiler", lambda: True)
    assert fusion.wanted(10**6, "cpu") and not fusion.wanted(10**6, "cuda")
    monkeypatch.setenv(fusion.ENV, "1")
    assert fusion.wanted(10**6, "cuda")
    assert chunk_rows("cpu") == 128 and chunk_rows("cuda") >= 4096
