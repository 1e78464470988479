"""The distribution a sampling step draws from: temperature, top-k and top-p applied to logits
(shared by :mod:`attnlab.decoding.sampling` and :mod:`attnlab.decoding.speculative`, whose
acceptance rule needs the processed distributions themselves).

Shape legend: V vocab.
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["next_token_probs"]


def next_token_probs(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> Tensor:
    """The distribution :func:`sample_next` samples from: ``softmax(logits / temperature)``
    restricted to the ``top_k`` likeliest tokens and to the ``top_p`` nucleus, renormalised.

    Args:
        logits: ``(..., V)``.
        temperature: > 0.
        top_k, top_p: as in :func:`sample_next`.

    Returns:
        ``(..., V)`` float32 probabilities (zero outside the kept tokens).
    """
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]  # (..., 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # drop a token when the tokens before it already reach top_p (the first is always kept)
        drop_sorted = (cum - sorted_logits.softmax(dim=-1)) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(dim=-1)
