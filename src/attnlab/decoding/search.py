"""Greedy decoding and batched beam search, for every model of :mod:`attnlab.decoding.interface`.

Beam search keeps the K best partial outputs of each input by summed log-probability; a beam that
has produced the end token is finished and only carries its score forward. The final choice
normalises by the GNMT length penalty (Wu et al. 2016)

    score(y) = log p(y | x) / lp(y),   lp(y) = ((5 + |y|) / 6)^α     (|y| counts the end token)

with α = 0 meaning no normalisation. Width 1 is exactly greedy decoding, which is how greedy
decoding is computed. All B·K beams advance together through one ``decode_step`` per output
position; the model's state (KV caches, recurrent states) is reordered to follow the survivors.

Shape legend: B inputs, K beam width, N = B·K rows, V vocabulary, T output steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.attention.cache import DecodeState
from attnlab.attention.capture import AttentionMaps, capture_attention

__all__ = ["Hypothesis", "length_penalty", "beam_search", "greedy_search"]

#: picks, from one step's captured attention, a ``(N, ..., S)`` tensor to keep per output token
StepAttention = Callable[[AttentionMaps], Tensor]


@dataclass
class Hypothesis:
    """One decoded output.

    Attributes:
        ids: the generated ids (not the prompt or start token), ending with the end token unless
            cut at ``max_len``.
        logprob: summed log-probability of ``ids``.
        score: ``logprob / length_penalty(len(ids))`` (what beam search maximises at the end).
        alignment: ``(..., T, S)``: the attention picked by ``step_attention`` at each output
            step (translation: every layer's and head's cross-attention over the source), or None.
    """

    ids: list[int]
    logprob: float
    score: float
    alignment: Tensor | None = None


def length_penalty(length: Tensor | int, alpha: float) -> Tensor:
    """GNMT length penalty ``((5 + length) / 6) ** alpha``."""
    length = torch.as_tensor(length, dtype=torch.float32)
    return ((5.0 + length) / 6.0) ** alpha


def _step(
    model: nn.Module,
    tokens: Tensor,
    state: DecodeState,
    step_attention: StepAttention | None,
    kwargs: dict[str, Any],
) -> tuple[Tensor, DecodeState, Tensor | None]:
    if step_attention is None:
        logits, state = model.decode_step(tokens, state, **kwargs)
        return logits, state, None
    with capture_attention(model) as maps:
        logits, state = model.decode_step(tokens, state, **kwargs)
    return logits, state, step_attention(maps)


def _cut(seq: list[int], end_id: int | None, pad_id: int) -> list[int]:
    """Up to and including the first end token (the padding of finished rows dropped)."""
    if end_id is not None and end_id in seq:
        return seq[: seq.index(end_id) + 1]
    return seq if end_id is None else [t for t in seq if t != pad_id]


@torch.no_grad()
def beam_search(
    model: nn.Module,
    state: DecodeState,
    first: Tensor,
    *,
    beam: int = 4,
    max_len: int,
    end_id: int | None = None,
    pad_id: int = 0,
    alpha: float = 0.6,
    banned: Sequence[int] = (),
    step_attention: StepAttention | None = None,
    first_kwargs: dict[str, Any] | None = None,
) -> list[Hypothesis]:
    """Batched beam search of width ``beam`` with the GNMT length penalty ``alpha``.

    Args:
        model: an :class:`~attnlab.decoding.interface.IncrementalDecoder`.
        state: ``model.start_decoding(...)`` for the B inputs (with room for ``max_len`` more
            tokens after ``first``).
        first: ``(B, T0)`` tokens fed first (an LM's prompt, a decoder's start token).
        beam: width K (1 = greedy).
        max_len: most output tokens per input (the end token included).
        end_id: the token that finishes an output (None: outputs run to ``max_len``).
        pad_id: what finished rows emit (dropped from the hypotheses).
        alpha: length-penalty exponent (0 = rank by raw log-probability).
        banned: ids never generated (padding, the start token).
        step_attention: picks the attention to keep at each step (see :class:`Hypothesis`).
        first_kwargs: extra arguments of the first ``decode_step`` (an LM prompt's
            ``attention_mask``).

    Returns:
        The best :class:`Hypothesis` per input by ``score``.

    Raises:
        ValueError: ``beam < 1`` or ``max_len < 1``.
    """
    if beam < 1:
        raise ValueError(f"beam width must be at least 1, got {beam}")
    if max_len < 1:
        raise ValueError(f"max_len must be at least 1, got {max_len}")
    B, K, dev = first.shape[0], beam, first.device
    logits, state, w = _step(model, first, state, step_attention, first_kwargs or {})
    # every beam of an input starts from the same first step: expand the B rows to B·K
    expand = torch.arange(B, device=dev).repeat_interleave(K)
    state = state.reorder(expand)
    logits = logits.index_select(0, expand.to(logits.device))
    w = None if w is None else w.index_select(0, expand.to(w.device))
    scores = torch.full((B, K), float("-inf"), device=dev)
    scores[:, 0] = 0.0  # keep one copy so the first step does not return K identical beams
    done = torch.zeros(B * K, dtype=torch.bool, device=dev)
    lengths = torch.zeros(B * K, dtype=torch.long, device=dev)
    tokens = torch.zeros(B * K, 0, dtype=torch.long, device=dev)
    align: Tensor | None = None  # (N, ..., t, S)
    banned = list(banned)
    for t in range(max_len):
        logp = logits.float().to(dev)
        if banned:
            logp[:, banned] = float("-inf")
        logp = logp.log_softmax(-1)  # (N, V)
        V = logp.shape[-1]
        if end_id is not None:
            # a finished beam may only "emit" padding, at no cost, so its score carries forward
            logp = logp.masked_fill(done[:, None], float("-inf"))
            logp[:, pad_id] = logp[:, pad_id].masked_fill(done, 0.0)
        cand = (scores.view(B * K, 1) + logp).view(B, K * V)  # (B, K·V)
        scores, idx = cand.topk(K, dim=-1)  # (B, K); -inf entries are dead beams
        parent = idx // V  # (B, K): the beam each survivor extends
        rows = (torch.arange(B, device=dev)[:, None] * K + parent).view(-1)  # (N,)
        tok = (idx % V).view(-1)  # (N,)
        was_done = done[rows]
        done = was_done | (tok == end_id) if end_id is not None else was_done
        lengths = lengths[rows] + (~was_done).long()
        tokens = torch.cat([tokens[rows], tok[:, None]], 1)  # (N, t + 1)
        if w is not None:
            step_w = w.index_select(0, rows.to(w.device))[..., None, :]  # (N, ..., 1, S)
            prev = None if align is None else align.index_select(0, rows.to(align.device))
            align = step_w if prev is None else torch.cat([prev, step_w], dim=-2)
        state = state.reorder(rows)
        finished = bool((done | torch.isinf(scores.view(-1))).all())
        if finished or t == max_len - 1:
            break
        logits, state, w = _step(model, tok[:, None], state, step_attention, {})
    final = scores.view(-1) / length_penalty(lengths, alpha).to(dev)  # (N,)
    final = final.masked_fill(~torch.isfinite(scores.view(-1)), float("-inf"))
    best = final.view(B, K).argmax(-1)  # (B,)
    hyps = []
    toks = tokens.tolist()
    for b in range(B):
        r = b * K + int(best[b])
        seq = _cut(toks[r], end_id, pad_id)
        a = None if align is None else align[r, ..., : len(seq), :].cpu()
        hyps.append(Hypothesis(seq, float(scores.view(-1)[r]), float(final[r]), a))
    return hyps


def greedy_search(model: nn.Module, state: DecodeState, first: Tensor, **kwargs: Any):
    """The most probable next token at every step: :func:`beam_search` with width 1."""
    kwargs.pop("beam", None)
    return beam_search(model, state, first, beam=1, **kwargs)
