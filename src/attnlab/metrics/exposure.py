"""Exposure bias, measured: the loss of the reference when the decoder reads its own predictions.

Teacher forcing scores every reference token y_t given the gold prefix y_<t. At test time the
decoder reads its own outputs instead. :func:`prefix_losses` scores the same reference tokens both
ways, per sentence:

    teacher-forced NLL  = mean_t −log p(y_t | x, y_<t)
    free-running NLL    = mean_t −log p(y_t | x, ŷ_<t),   ŷ_t = argmax p(· | x, ŷ_<t)

The free-running decoder runs for exactly the reference's length (it is not stopped at its own
``<end>``), so the two are means over the same positions. Their difference is the price of never
having seen one's own mistakes in training (Bengio et al. 2015; Ranzato et al. 2016).

Shape legend: B sentences, S source length, T reference length (``<end>`` included), V target
vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.data.translation import PAD_ID, START_ID, TranslationVocabs
from attnlab.layers import evaluating
from attnlab.metrics.translation import pair_batches

__all__ = ["free_running_logits", "prefix_losses"]


@torch.no_grad()
def free_running_logits(model: nn.Module, src: Tensor, src_mask: Tensor, steps: int) -> Tensor:
    """Logits ``(B, steps, V)`` of a greedy decoder fed its own predictions, ``<start>`` first.

    Uses the decoding interface (``start_decoding`` / ``decode_step``) of every translation model.
    """
    B = src.shape[0]
    state = model.start_decoding(src, src_mask, steps + 1)
    token = torch.full((B, 1), START_ID, dtype=torch.long, device=src.device)  # (B, 1)
    out = []
    for _ in range(steps):
        logits, state = model.decode_step(token, state)  # (B, V)
        out.append(logits)
        token = logits.argmax(-1, keepdim=True)  # (B, 1)
    return torch.stack(out, dim=1)  # (B, steps, V)


def _sentence_nll(logits: Tensor, target: Tensor) -> Tensor:
    """Mean NLL per sentence ``(B,)`` over the non-padding targets."""
    nll = F.cross_entropy(logits.float().transpose(1, 2), target, reduction="none")  # (B, T)
    real = target != PAD_ID
    return (nll * real).sum(1) / real.sum(1).clamp(min=1)


@torch.no_grad()
def prefix_losses(
    model: nn.Module,
    vocabs: TranslationVocabs,
    pairs: Sequence[tuple[str, str]],
    *,
    batch_size: int = 128,
) -> dict[str, list]:
    """Per-sentence teacher-forced and free-running NLL of the references of ``pairs``.

    Args:
        model: a translation model (put in eval mode here, restored afterwards).
        vocabs: its vocabularies.
        pairs: ``(source, reference)`` sentences.
        batch_size: sentences per batch.

    Returns:
        ``{"teacher_forced": [...], "free_running": [...], "length": [...],
        "teacher_forced_wrong": [...], "free_running_wrong": [...]}``: per sentence, one NLL
        (nats per token, ``<end>`` included), the reference length in target tokens, and per
        reference position whether the argmax differs from the reference token (given the gold
        prefix / the model's own greedy prefix; a list of ``length`` booleans).
    """
    dev = next(model.parameters()).device
    keys = (
        "teacher_forced",
        "free_running",
        "length",
        "teacher_forced_wrong",
        "free_running_wrong",
    )
    out: dict[str, list] = {k: [] for k in keys}
    with evaluating(model):
        for batch in pair_batches(vocabs, pairs, batch_size=batch_size, device=dev):
            T = batch.tgt_in.shape[1]
            tf = model(batch.src, batch.src_mask, batch.tgt_in)  # (B, T, V)
            free = free_running_logits(model, batch.src, batch.src_mask, T)  # (B, T, V)
            out["teacher_forced"] += _sentence_nll(tf, batch.tgt_out).tolist()
            out["free_running"] += _sentence_nll(free, batch.tgt_out).tolist()
            lengths = (batch.tgt_out != PAD_ID).sum(1).tolist()
            out["length"] += lengths
            for key, logits in (("teacher_forced_wrong", tf), ("free_running_wrong", free)):
                wrong = (logits.argmax(-1) != batch.tgt_out).tolist()  # (B, T)
                out[key] += [row[:n] for row, n in zip(wrong, lengths)]
    return out
