"""Teacher-forced scoring: perplexity, KL divergence to the source, top-1 agreement, one pass.

Why top-k and not full logits: the source's next-token distributions are computed once and
cached, and full logits (49,152 floats a token for the default model) would make that cache
hundreds of megabytes for a smoke run. The reference keeps, per position, the source's top-k
token ids and log-probabilities and the actual next token's log-probability (``kl_topk`` says
what KL that gives). Logits are formed chunk by chunk from the final hidden states, so a batch
never holds a (batch x length x vocab) float32 tensor.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from quantgate.evaluate import fusion

_CHUNK = 128  # positions per lm_head chunk on a CPU: 64-256 measured; larger chunks' logits fall out of cache
# on a GPU: one chunk's float32 logits are 2 GB at a 128k vocabulary, and the head runs as a few
# large products instead of thousands of small launches
_GPU_CHUNK = 4096


def chunk_rows(device: torch.device | str) -> int:
    """Positions per lm_head chunk on ``device`` (part of a GPU reference's key: the product's
    kernel, and so its rounding, can depend on the rows it is given)."""
    return _CHUNK if torch.device(device).type == "cpu" else _GPU_CHUNK


@dataclass
class Reference:
    """The source's view of a set of sequences, position by position (positions 0..len-2)."""

    topk_ids: list[torch.Tensor]  # per sequence: [positions, k] int32
    topk_logp: list[torch.Tensor]  # per sequence: [positions, k] float32
    target_logp: list[torch.Tensor]  # per sequence: [positions] float32

    def to_state(self) -> dict:
        """The reference as plain tensors and lists (what the reference cache stores)."""
        return {"topk_ids": self.topk_ids, "topk_logp": self.topk_logp, "target_logp": self.target_logp}

    def own_scores(self) -> list[Scores]:
        """The source scored against its own reference, without running it again: its NLL is
        the reference's target log-probability negated (the same two numbers subtracted the
        other way round: the same bits a scoring pass gives), KL 0 and top-1 agreement at every
        position by definition (a scoring pass of the source gives exactly these)."""
        return [
            Scores(nll=-t, kld=torch.zeros_like(t), agree=torch.ones_like(t, dtype=torch.bool))
            for t in self.target_logp
        ]

    @classmethod
    def from_state(cls, state: dict) -> Reference:
        """The inverse of ``to_state``."""
        return cls(state["topk_ids"], state["topk_logp"], state["target_logp"])


@dataclass
class Scores:
    """Per-position measures of one model on one sequence, against the source reference."""

    nll: torch.Tensor  # negative log-likelihood of the actual next token
    kld: torch.Tensor
    agree: torch.Tensor  # bool: the model's top-1 equals the source's top-1


@dataclass
class _Chunk:
    """Up to ``chunk_rows`` scored positions of a batch, across its sequences."""

    logits: torch.Tensor  # [n, vocab] float32
    lse: torch.Tensor  # [n] log-sum-exp of each row: log-probability = logits - lse
    top: torch.Tensor  # [n] each row's largest logit
    targets: torch.Tensor  # [n] the actual next tokens
    rows: slice  # these positions' place in the batch's concatenated positions


def _decoder_and_head(model):
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    return decoder, model.get_output_embeddings()


def _batches(sequences: list[list[int]], batch_size: int):
    for start in range(0, len(sequences), batch_size):
        yield start, sequences[start : start + batch_size]


@torch.inference_mode()
def _chunks(model, batch: list[list[int]], pad_id: int, stats: fusion.ChunkStats) -> Iterator[_Chunk]:
    """One decoder pass over ``batch``, then its scored positions (all sequences' positions
    0..len-2, concatenated) through the head a chunk at a time.

    Why log-sum-exp and not ``log_softmax``: every measure needs only a few log-probabilities
    per position (the target's, the reference's top-k, the top-1), so the [n, vocab] array of
    log-probabilities is never formed; the head's bf16 output is widened to float32 once."""
    decoder, head = _decoder_and_head(model)
    width = max(len(s) for s in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, seq in enumerate(batch):
        ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
    device = head.weight.device  # the model's device (a GPU worker's CUDA): inputs go to it
    # no mask when nothing is padded: the decoder's causal fast paths apply
    attention_mask = None if bool(mask.all()) else mask.to(device)
    hidden = decoder(input_ids=ids.to(device), attention_mask=attention_mask).last_hidden_state
    scored = torch.cat([hidden[row, : len(seq) - 1] for row, seq in enumerate(batch)])
    targets = torch.tensor([t for seq in batch for t in seq[1:]], dtype=torch.long).to(device)
    step = chunk_rows(device)
    for start in range(0, len(scored), step):
        rows = slice(start, min(len(scored), start + step))
        logits, lse, top = stats(head(scored[rows]))
        yield _Chunk(logits, lse, top, targets[rows], rows)


def _scored_tokens(sequences: list[list[int]]) -> int:
    return sum(max(0, len(s) - 1) for s in sequences)


def _split(values: torch.Tensor, batch: list[list[int]]) -> list[torch.Tensor]:
    return list(values.split([len(seq) - 1 for seq in batch]))


def build_reference(
    model, sequences: list[list[int]], *, k: int, batch_size: int, pad_id: int, on_batch=None
) -> Reference:
    """Run the source over ``sequences`` once and keep what scoring needs: its top-``k`` next
    tokens with their log-probabilities, and the actual next token's, at every position."""
    ref = Reference([], [], [])
    stats = fusion.prepare(_decoder_and_head(model)[0], _scored_tokens(sequences))
    for _, batch in _batches(sequences, batch_size):
        ids, logp, target = [], [], []
        for chunk in _chunks(model, batch, pad_id, stats):
            top = torch.topk(chunk.logits, k=min(k, chunk.logits.shape[-1]), dim=-1)
            ids.append(top.indices.to(torch.int32))
            logp.append(top.values - chunk.lse[:, None])
            target.append(chunk.logits.gather(1, chunk.targets[:, None])[:, 0] - chunk.lse)
        # the reference lives on the CPU (it is cached on disk and outlives the model)
        ref.topk_ids += _split(torch.cat(ids).cpu(), batch)
        ref.topk_logp += _split(torch.cat(logp).cpu(), batch)
        ref.target_logp += _split(torch.cat(target).cpu(), batch)
        if on_batch:
            on_batch(len(batch))
    return ref


def kl_topk(ref_logp: torch.Tensor, q_logp: torch.Tensor) -> torch.Tensor:
    """KL(source || model) per position, over the source's top-k and one tail bucket.

    ``q_logp`` is the model's log-probability of each of the source's top-k tokens. The two
    distributions are coarsened to (those k tokens, everything else):

        KL_k = sum_i p_i (log p_i - log q_i) + P_tail (log P_tail - log Q_tail)

    a lower bound on the full KL (coarsening never increases divergence), equal to it when the
    tail carries no mass; the source scored against its own reference gives exactly 0.
    """
    p = ref_logp.exp()
    head = (p * (ref_logp - q_logp)).sum(-1)
    p_tail = (1 - p.sum(-1)).clamp_min(0)
    q_tail = (1 - q_logp.exp().sum(-1)).clamp_min(1e-12)
    tail = torch.where(p_tail > 1e-12, p_tail * (p_tail.clamp_min(1e-12).log() - q_tail.log()), 0.0)
    return (head + tail).clamp_min(0)


def score(
    model, sequences: list[list[int]], ref: Reference, *, batch_size: int, pad_id: int, on_batch=None
) -> list[Scores]:
    """Score ``model`` on ``sequences`` against the source's reference: per position NLL, KL
    to the source and top-1 agreement (the source against itself: KL 0, agreement 1)."""
    out: list[Scores] = []
    decoder, head = _decoder_and_head(model)
    stats = fusion.prepare(decoder, _scored_tokens(sequences))
    device = head.weight.device
    for start, batch in _batches(sequences, batch_size):
        ref_ids = torch.cat(ref.topk_ids[start : start + len(batch)]).long().to(device)
        ref_logp = torch.cat(ref.topk_logp[start : start + len(batch)]).to(device)
        nll, kld, agree = [], [], []
        for chunk in _chunks(model, batch, pad_id, stats):
            ids = ref_ids[chunk.rows]
            nll.append(chunk.lse - chunk.logits.gather(1, chunk.targets[:, None])[:, 0])
            kld.append(kl_topk(ref_logp[chunk.rows], chunk.logits.gather(1, ids) - chunk.lse[:, None]))
            # ties are common in bf16 logits: the source's top token agrees when it is
            # among the model's top tokens, whichever index a tie-break would pick
            agree.append(chunk.logits.gather(1, ids[:, :1])[:, 0] >= chunk.top)
        out += [
            Scores(nll=n, kld=d, agree=a)
            for n, d, a in zip(
                _split(torch.cat(nll).cpu(), batch),
                _split(torch.cat(kld).cpu(), batch),
                _split(torch.cat(agree).cpu(), batch),
                strict=True,
            )
        ]
        if on_batch:
            on_batch(len(batch))
    return out
