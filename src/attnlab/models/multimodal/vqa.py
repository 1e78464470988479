"""Visual question answering as classification over a fixed answer list (``answers="softmax"``)
or as multiple choice over the answers' vectors (``answers="choice"``,
:mod:`~attnlab.models.multimodal.answers`).

LSTM model (the lecture's early VQA architecture):

    q = LSTM(E[question])_last          the question vector (B, D)
    v = ReLU(W_v · flatten(CNN grid))   the image vector (B, D); flattening keeps *where* things are
    z = [v; q]  (concat)  or  v ⊙ q  (product)  or  q  (none: the "blind", question-only model)
    p(answer) = softmax(MLP(z))

Transformer model: the question tokens self-attend (padding masked) and cross-attend to the image
tokens (CNN grid or ViT patches, with 2-D positions: the trunk of
:mod:`~attnlab.models.multimodal.trunk`); their mean goes to the same classifier.

The blind model is trained exactly like the others; where it matches them, the answers were
predictable from the question alone (language bias), not read from the image.

Shape legend: B batch, L question length, N image tokens, C encoder width, D d_model, A answers.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from attnlab.attention.capture import capture_attention
from attnlab.config.multimodal import VQAConfig
from attnlab.errors import UserError
from attnlab.layers.rnn import stacked_rnn
from attnlab.models.multimodal.answers import AnswerScorer
from attnlab.models.multimodal.encoders import ImageEncoder, check_images, upgrade_weights
from attnlab.models.multimodal.trunk import ImageTextTransformer
from attnlab.models.registry import register_kind

__all__ = ["LSTMVQA", "TransformerVQA", "build_vqa"]


def _check_inputs(config: VQAConfig, images: Tensor, questions: Tensor, lengths: Tensor) -> None:
    check_images(images, config.image_size)
    if questions.dim() != 2 or lengths.shape != questions.shape[:1]:
        raise ValueError(
            f"questions must be (B, L) with lengths (B,), got "
            f"{tuple(questions.shape)} and {tuple(lengths.shape)}"
        )
    if int(lengths.min()) < 1 or int(lengths.max()) > questions.shape[1]:
        raise UserError(
            f"question lengths {lengths.tolist()} must be in [1, "
            f"{questions.shape[1]}] (empty question?)"
        )
    if questions.shape[1] > config.max_len:
        raise UserError(
            f"question of {questions.shape[1]} tokens is longer than max_len={config.max_len}"
        )


def _classifier(config: VQAConfig, width: int) -> nn.Module:
    """``(B, width) -> (B, A)``: dropout, a hidden ReLU layer of 2·D, the answer scores
    (``answers="choice"``: an :class:`AnswerScorer`, called with the word embeddings)."""
    if config.answers == "choice":
        return AnswerScorer(width, config.d_model, config.answer_ids, config.dropout)
    return nn.Sequential(
        nn.Dropout(config.dropout),
        nn.Linear(width, 2 * config.d_model),
        nn.ReLU(),
        nn.Linear(2 * config.d_model, config.n_answers),
    )


def _answer(head: nn.Module, z: Tensor, embedding: nn.Embedding) -> Tensor:
    """The answer scores of the fused features ``z``, by either kind of head."""
    if isinstance(head, AnswerScorer):
        return head(z, embedding.weight)
    return head(z)


class LSTMVQA(nn.Module):
    """Question LSTM + CNN image vector, fused by concatenation or product (or blind)."""

    kind: ClassVar[str] = "vqa_lstm"

    def __init__(self, config: VQAConfig) -> None:
        super().__init__()
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model, padding_idx=0)
        self.lstm = stacked_rnn("lstm", c.d_model, c.d_model, c.n_layers)
        if c.fusion != "none":  # the blind model has no image encoder at all
            self.encoder = ImageEncoder(c, reads="tokens")
            n_tokens = self.encoder.grid[0] * self.encoder.grid[1]
            self.img_proj = nn.Sequential(
                nn.Linear(n_tokens * self.encoder.feature_dim, c.d_model), nn.ReLU()
            )
        self.head = _classifier(c, 2 * c.d_model if c.fusion == "concat" else c.d_model)

    def question_vector(self, questions: Tensor, lengths: Tensor) -> Tensor:
        """The LSTM's last hidden state at each question's true end, ``(B, D)``."""
        packed = nn.utils.rnn.pack_padded_sequence(
            self.tok_emb(questions), lengths.cpu(), batch_first=True, enforce_sorted=False
        )
        _, (h, _) = self.lstm(packed)  # h (layers, B, D)
        return h[-1]

    def image_vector(self, images: Tensor) -> Tensor:
        """``(B, D)`` from the flattened grid of image tokens (keeps positions)."""
        return self.img_proj(self.encoder.tokens(images).flatten(1))  # (B, N·C) -> (B, D)

    def forward(self, images: Tensor, questions: Tensor, lengths: Tensor) -> Tensor:
        """Answer logits ``(B, A)``; the blind model never looks at ``images``.

        Args:
            images: ``(B, 3, H, W)``; questions: ``(B, L)`` word ids, right-padded;
            lengths: ``(B,)`` true question lengths.
        """
        _check_inputs(self.config, images, questions, lengths)
        q = self.question_vector(questions, lengths)
        fusion = self.config.fusion
        if fusion == "none":
            return _answer(self.head, q, self.tok_emb)
        v = self.image_vector(images)
        z = torch.cat((v, q), dim=-1) if fusion == "concat" else v * q
        return _answer(self.head, z, self.tok_emb)


class TransformerVQA(ImageTextTransformer):
    """Question tokens attend to each other and to the image tokens; mean-pool; classify.

    Attributes (besides the trunk's): ``head``, the answer classifier.
    """

    kind: ClassVar[str] = "vqa_transformer"

    def __init__(self, config: VQAConfig) -> None:
        super().__init__(config, ImageEncoder(config, reads="tokens"))
        self.head = _classifier(config, config.d_model)

    def forward(
        self, images: Tensor, questions: Tensor, lengths: Tensor, *, need_weights: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Answer logits ``(B, A)``.

        Args:
            images, questions, lengths: as for :meth:`LSTMVQA.forward`.
            need_weights: also return each block's question-to-image cross-attention
                ``(B, H, L, N)`` (read through :func:`attnlab.attention.capture_attention`).
        """
        if need_weights:
            with capture_attention(self) as maps:
                logits = self(images, questions, lengths)
            return logits, maps.select("cross_attn")
        _check_inputs(self.config, images, questions, lengths)
        L = questions.shape[1]
        real = torch.arange(L, device=questions.device)[None, :] < lengths[:, None]  # (B, L)
        x = self.run_text(questions, self.image_tokens(images), mask=real[:, None, None, :])
        pooled = (x * real[..., None]).sum(1) / lengths[:, None].to(x.dtype)  # (B, D)
        return _answer(self.head, pooled, self.tok_emb)


def build_vqa(config: VQAConfig) -> LSTMVQA | TransformerVQA:
    """The VQA model named by ``config.arch``."""
    return LSTMVQA(config) if config.arch == "lstm" else TransformerVQA(config)


for _cls in (LSTMVQA, TransformerVQA):
    register_kind(_cls.kind, VQAConfig, _cls, artifacts="scene_vocab", upgrade=upgrade_weights)
