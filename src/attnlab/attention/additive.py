"""Bahdanau-style attention inside an RNN decoder, with the alignment scores of the lecture.

    e_j = score(s, h_j)                   score of source position j for decoder state s
    α   = softmax(e) over the (unpadded) source
    c   = Σ_j α_j h_j                      the context vector for this decoder step

The scores (``score=``):

    additive  e_j = vᵀ tanh(W_s s + W_h h_j + b)    Bahdanau et al. 2015 (the default)
    concat    e_j = wᵀ [s; h_j] + b                 one linear layer on the concatenation: the
                                                    lecture's simplest f_att
    dot       e_j = sᵀ h_j                          needs Ds = Dh; no parameters
    general   e_j = sᵀ W h_j                        bilinear (Luong et al. 2015's "general")

``concat`` is linear in s, and the softmax over j cancels every term that does not depend on j:
its weights α are the same for every decoder state (softmax_j(w_hᵀ h_j)), one fixed average of the
source per sentence. The weights α are returned, and reported to an open
:func:`attnlab.attention.capture_attention` (as ``(B, S)`` for one query, ``(B, T, S)`` for
several); the layer keeps nothing.

Shape legend: B batch, S source length, Ds decoder state width, Dh encoder state width, A
attention width, T decoder steps (optional: several queries at once), K the width of a projected
key (A for additive, 1 for concat, Dh for dot, Ds for general).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from attnlab.layers.hook import HookPoint, report_attention

__all__ = ["AdditiveAttention", "AlignmentScore", "SCORE_FORMULAS"]

AlignmentScore = Literal["additive", "concat", "dot", "general"]
#: each score's formula, as the docs and the explorer print it
SCORE_FORMULAS: dict[str, str] = {
    "additive": "vᵀ tanh(W_s s + W_h h + b)",
    "concat": "wᵀ [s; h] + b",
    "dot": "sᵀ h",
    "general": "sᵀ W h",
}


class AdditiveAttention(nn.Module):
    """Bahdanau's attention with a choice of alignment score.

    Args:
        query_dim: decoder state width Ds.
        key_dim: encoder state width Dh.
        attn_dim: width A of the hidden scoring layer (``additive`` only; default ``key_dim``).
        score: ``additive`` (default) | ``concat`` | ``dot`` | ``general``; see the module.

    Raises:
        ValueError: an unknown score, ``dot`` with Ds ≠ Dh, or ``attn_dim`` for a score that has
            no hidden layer.
    """

    def __init__(
        self,
        query_dim: int,
        key_dim: int,
        attn_dim: int | None = None,
        *,
        score: AlignmentScore = "additive",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if score not in SCORE_FORMULAS:
            raise ValueError(
                f"unknown alignment score {score!r}; choose from {list(SCORE_FORMULAS)}"
            )
        if score == "dot" and query_dim != key_dim:
            raise ValueError(
                f"score='dot' needs the decoder state as wide as an encoder state, got "
                f"query_dim={query_dim} and key_dim={key_dim} (a bidirectional encoder doubles "
                "key_dim); use score='general' or a unidirectional encoder"
            )
        if attn_dim is not None and score != "additive":
            raise ValueError(f"attn_dim applies to score='additive' only, not {score!r}")
        self.score, self.query_dim = score, query_dim
        kw = {"device": device, "dtype": dtype}
        if score == "additive":
            attn_dim = key_dim if attn_dim is None else attn_dim
            self.W_s = nn.Linear(query_dim, attn_dim, bias=False, **kw)
            self.W_h = nn.Linear(key_dim, attn_dim, bias=True, **kw)
            self.v = nn.Linear(attn_dim, 1, bias=False, **kw)
        elif score == "concat":
            self.w = nn.Linear(query_dim + key_dim, 1, bias=True, **kw)  # wᵀ [s; h] + b
        elif score == "general":
            self.W = nn.Linear(key_dim, query_dim, bias=False, **kw)  # h -> W h
        # hook points: energies e and weights α (B, T, S), context c (B, T, Dh); T = 1 per step
        self.hook_attn_scores, self.hook_pattern = HookPoint(), HookPoint()
        self.hook_context = HookPoint()

    def project_keys(self, keys: Tensor) -> Tensor:
        """The part of the score that depends on the keys only, ``(B, S, K)``: ``W_h h + b``
        (additive), ``w_hᵀ h + b`` (concat), ``h`` (dot), ``W h`` (general). Compute it once per
        source sentence."""
        if self.score == "additive":
            return self.W_h(keys)  # (B, S, A)
        if self.score == "concat":
            w_h = self.w.weight[:, self.query_dim :]  # (1, Dh): the keys' part of wᵀ [s; h]
            return nn.functional.linear(keys, w_h, self.w.bias)  # (B, S, 1)
        if self.score == "general":
            return self.W(keys)  # (B, S, Ds)
        return keys  # dot: (B, S, Dh)

    def energies(self, query: Tensor, keys_proj: Tensor) -> Tensor:
        """Scores ``e (B, T, S)`` of queries ``(B, T, Ds)`` against :meth:`project_keys` output."""
        if self.score == "additive":
            hidden = torch.tanh(self.W_s(query)[:, :, None, :] + keys_proj[:, None, :, :])
            return self.v(hidden).squeeze(-1)  # (B, T, S, A) -> (B, T, S)
        if self.score == "concat":
            w_s = self.w.weight[:, : self.query_dim]  # (1, Ds): the query's part of wᵀ [s; h]
            return nn.functional.linear(query, w_s) + keys_proj.transpose(1, 2)  # (B, T, S)
        return query @ keys_proj.transpose(1, 2)  # dot / general: (B, T, Ds) @ (B, Ds, S)

    def forward(
        self,
        query: Tensor,
        keys: Tensor,
        mask: Tensor | None = None,
        *,
        keys_proj: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Score every source position for the decoder state(s).

        Args:
            query: decoder state ``(B, Ds)`` or ``(B, T, Ds)``.
            keys: encoder states ``(B, S, Dh)`` (they are also the values).
            mask: boolean ``(B, S)``, True for real (not padding) source positions.
            keys_proj: precomputed :meth:`project_keys` output, to save work at each step.

        Returns:
            ``context (B, Dh)`` and ``weights (B, S)`` (or ``(B, T, Dh)`` and ``(B, T, S)``).
        """
        single = query.dim() == 2
        if single:
            query = query[:, None]  # (B, 1, Ds)
        if keys.dim() != 3 or keys.shape[0] != query.shape[0]:
            raise ValueError(f"keys must be (B={query.shape[0]}, S, Dh), got {tuple(keys.shape)}")
        if mask is not None and mask.shape != keys.shape[:2]:
            raise ValueError(
                f"mask must be (B, S) = {tuple(keys.shape[:2])}, got {tuple(mask.shape)}"
            )
        kp = self.project_keys(keys) if keys_proj is None else keys_proj  # (B, S, K)
        e = self.energies(query, kp)  # (B, T, S)
        if mask is not None:
            e = e.masked_fill(~mask[:, None, :], float("-inf"))
            empty = ~mask.any(dim=-1)[:, None, None]  # (B, 1, 1)
            e = e.masked_fill(empty, 0.0)
        weights = self.hook_attn_scores(e).softmax(dim=-1)
        if mask is not None:
            weights = weights.masked_fill(empty, 0.0)
        weights = self.hook_pattern(weights)
        context = self.hook_context(weights @ keys)  # (B, T, Dh)
        if single:
            context, weights = context[:, 0], weights[:, 0]  # (B, Dh), (B, S)
        report_attention(self, weights)
        return context, weights
