"""Teacher-forced scoring: perplexity, KL divergence to the source, top-1 agreement, one pass.

Why top-k and not full logits: the source's next-token distributions are computed once and
kept, and full logits (49,152 floats a token for the default model) would make that cache
hundreds of megabytes for a smoke run. The reference keeps, per position, the source's top-k
token ids and log-probabilities and the log-probability of the actual next token. KL is then
taken between the two distributions coarsened to (those k tokens, everything else):

    KL_k = sum_i p_i (log p_i - log q_i) + P_tail (log P_tail - log Q_tail)

which is a lower bound on the full KL (coarsening never increases divergence) and equals it
when the tail carries no mass; with k = 32 the gap is far below the differences a gate acts on.
The source scored against its own reference gives exactly 0 and agreement 1.

Logits are formed chunk by chunk from the final hidden states, so a batch never holds a
(batch x length x vocab) float32 tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_CHUNK = 1024  # positions per lm_head chunk


@dataclass
class Reference:
    """The source's view of a set of sequences, position by position (positions 0..len-2)."""

    topk_ids: list[torch.Tensor]  # per sequence: [positions, k] int32
    topk_logp: list[torch.Tensor]  # per sequence: [positions, k] float32
    target_logp: list[torch.Tensor]  # per sequence: [positions] float32

    def to_state(self) -> dict:
        return {"topk_ids": self.topk_ids, "topk_logp": self.topk_logp, "target_logp": self.target_logp}

    @classmethod
    def from_state(cls, state: dict) -> Reference:
        return cls(state["topk_ids"], state["topk_logp"], state["target_logp"])


@dataclass
class Scores:
    """Per-position measures of one model on one sequence, against the source reference."""

    nll: torch.Tensor  # negative log-likelihood of the actual next token
    kld: torch.Tensor
    agree: torch.Tensor  # bool: the model's top-1 equals the source's top-1


def _decoder_and_head(model):
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    return decoder, model.get_output_embeddings()


def _batches(sequences: list[list[int]], batch_size: int):
    for start in range(0, len(sequences), batch_size):
        yield start, sequences[start : start + batch_size]


@torch.inference_mode()
def _log_probs(model, batch: list[list[int]], pad_id: int):
    """Yield (index in batch, [len-1, vocab] float32 log-probs) for each sequence."""
    decoder, head = _decoder_and_head(model)
    width = max(len(s) for s in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, seq in enumerate(batch):
        ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
    hidden = decoder(input_ids=ids, attention_mask=mask).last_hidden_state
    for row, seq in enumerate(batch):
        h = hidden[row, : len(seq) - 1]
        parts = [torch.log_softmax(head(h[i : i + _CHUNK]).float(), dim=-1) for i in range(0, len(h), _CHUNK)]
        yield row, torch.cat(parts) if parts else h.new_zeros((0, 1))


def build_reference(
    model, sequences: list[list[int]], *, k: int, batch_size: int, pad_id: int, on_batch=None
) -> Reference:
    ref = Reference([], [], [])
    for _, batch in _batches(sequences, batch_size):
        for row, logp in _log_probs(model, batch, pad_id):
            targets = torch.tensor(batch[row][1:], dtype=torch.long)
            top = torch.topk(logp, k=min(k, logp.shape[-1]), dim=-1)
            ref.topk_ids.append(top.indices.to(torch.int32))
            ref.topk_logp.append(top.values)
            ref.target_logp.append(logp.gather(1, targets[:, None])[:, 0])
        if on_batch:
            on_batch(len(batch))
    return ref


def kl_topk(ref_ids: torch.Tensor, ref_logp: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """KL(source || model) per position, over the source's top-k and one tail bucket."""
    q_logp = logp.gather(1, ref_ids.long())
    p = ref_logp.exp()
    head = (p * (ref_logp - q_logp)).sum(-1)
    p_tail = (1 - p.sum(-1)).clamp_min(0)
    q_tail = (1 - q_logp.exp().sum(-1)).clamp_min(1e-12)
    tail = torch.where(p_tail > 1e-12, p_tail * (p_tail.clamp_min(1e-12).log() - q_tail.log()), 0.0)
    return (head + tail).clamp_min(0)


def score(
    model, sequences: list[list[int]], ref: Reference, *, batch_size: int, pad_id: int, on_batch=None
) -> list[Scores]:
    out: list[Scores] = []
    for start, batch in _batches(sequences, batch_size):
        for row, logp in _log_probs(model, batch, pad_id):
            i = start + row
            targets = torch.tensor(batch[row][1:], dtype=torch.long)
            out.append(
                Scores(
                    nll=-logp.gather(1, targets[:, None])[:, 0],
                    kld=kl_topk(ref.topk_ids[i], ref.topk_logp[i], logp),
                    # ties are common in bf16 logits: the source's top token agrees when it is
                    # among the model's top tokens, whichever index a tie-break would pick
                    agree=logp.gather(1, ref.topk_ids[i][:, :1].long())[:, 0] >= logp.max(-1).values,
                )
            )
        if on_batch:
            on_batch(len(batch))
    return out
