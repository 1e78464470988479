"""VQA as multiple choice: every candidate answer is a vector, scored by its similarity with the
fused image–question feature.

    q   = MLP(z)                       the fused feature z (B, F) as a query (B, D)
    a_k = W_a · E[answer_k]            each answer's word embedding, projected (A, D)
    score_k = q · a_k                  (B, A); softmax over the candidates, cross-entropy

The softmax classifier (:func:`~attnlab.models.multimodal.vqa.answer_head` with
``answers="softmax"``) learns one output row per answer, independent of the others; here the
answers are read through the same word embeddings E as the questions ("what colour is the red
circle?" and the answer "red" share E[red]), so what the model knows about a word reaches the
answer too.

Shape legend: B batch, F fused width, D d_model, A answers, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["AnswerScorer"]


class AnswerScorer(nn.Module):
    """Scores the candidate answers by ``MLP(z) · W_a E[answer]`` (see the module docstring).

    Args:
        width: F, the fused feature's width.
        d_model: D.
        answer_ids: the word id of each answer (``A`` ids).
        dropout: before the query MLP.

    Attributes:
        query: the MLP ``F -> 2D -> D``; answer_proj: ``W_a`` (``D -> D``);
        answer_ids: ``(A,)`` (a buffer, not saved: the config holds them).
    """

    def __init__(self, width: int, d_model: int, answer_ids: list[int], dropout: float) -> None:
        super().__init__()
        self.query = nn.Sequential(
            nn.Dropout(dropout),
            nn.Linear(width, 2 * d_model),
            nn.ReLU(),
            nn.Linear(2 * d_model, d_model),
        )
        self.answer_proj = nn.Linear(d_model, d_model)
        self.register_buffer("answer_ids", torch.tensor(answer_ids), persistent=False)

    def answer_vectors(self, embedding: Tensor) -> Tensor:
        """``(A, D)``: each answer's vector from the word-embedding matrix ``(V, D)``."""
        return self.answer_proj(embedding[self.answer_ids])

    def forward(self, z: Tensor, embedding: Tensor) -> Tensor:
        """Scores ``(B, A)`` of the fused features ``z (B, F)``, answers read from ``embedding``."""
        return self.query(z) @ self.answer_vectors(embedding).T
