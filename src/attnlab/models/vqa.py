"""Visual question answering as classification over a fixed answer list.

LSTM model (the lecture's early VQA architecture):

    q = LSTM(E[question])_last          the question vector (B, D)
    v = ReLU(W_v · flatten(CNN grid))   the image vector (B, D); flattening keeps *where* things are
    z = [v; q]  (concat)  or  v ⊙ q  (product)  or  q  (none: the "blind", question-only model)
    p(answer) = softmax(MLP(z))

Transformer model: the question tokens self-attend (padding masked) and cross-attend to the image
tokens (CNN grid or ViT patches, with 2-D positions); their mean goes to the same classifier.

The blind model is trained exactly like the others; where it matches them, the answers were
predictable from the question alone (language bias), not read from the image.

Shape legend: B batch, L question length, N image tokens, C encoder width, D d_model, A answers.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from attnlab.errors import UserError
from attnlab.layers.block import build_block
from attnlab.layers.norm import make_norm
from attnlab.layers.position import LearnedPositionalEmbedding, sincos_2d
from attnlab.models.caption import ENCODERS, build_image_encoder, freeze_unused
from attnlab.models.registry import register_kind

__all__ = ["VQAConfig", "VQA_PRESETS", "LSTMVQA", "TransformerVQA", "build_vqa"]

ARCHS = ("lstm", "transformer")
FUSIONS = ("concat", "product", "none")

VQA_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(encoder_width=16, encoder_depth=3, d_model=64, n_layers=1, n_heads=2),
    "small": dict(encoder_width=32, encoder_depth=3, d_model=128, n_layers=2, n_heads=4),
}


@dataclass
class VQAConfig:
    """Hyper-parameters of the VQA models.

    Attributes:
        arch: ``lstm`` (question LSTM + fused CNN vector) or ``transformer`` (question tokens
            cross-attend to image tokens).
        fusion: LSTM model only: ``concat``, ``product`` (element-wise), or ``none`` — the blind,
            question-only model (no image encoder at all).
        vocab_size: question words including the special tokens.
        n_answers: size of the answer list.
        image_size, encoder, encoder_width, encoder_depth, patch_size: the image encoder (see
            :func:`attnlab.models.caption.build_image_encoder`).
        d_model: LSTM hidden size / Transformer width; n_layers: LSTM layers / Transformer blocks.
        n_heads: Transformer heads.
        max_len: longest question in tokens.
        dropout: dropout before the classifier and in the Transformer.
    """

    arch: str = "lstm"
    fusion: str = "concat"
    vocab_size: int = 64
    n_answers: int = 25
    image_size: int = 32
    encoder: str = "cnn"
    encoder_width: int = 32
    encoder_depth: int = 3
    patch_size: int = 4
    d_model: int = 128
    n_layers: int = 1
    n_heads: int = 4
    max_len: int = 24
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"unknown arch {self.arch!r}; choose from {ARCHS}")
        if self.fusion not in FUSIONS:
            raise ValueError(f"unknown fusion {self.fusion!r}; choose from {FUSIONS}")
        if self.arch == "transformer" and self.fusion == "none":
            raise ValueError("the blind (fusion='none') model is the LSTM one: use arch='lstm'")
        if self.encoder not in ENCODERS:
            raise ValueError(f"unknown encoder {self.encoder!r}; choose from {ENCODERS}")
        for name in (
            "vocab_size",
            "n_answers",
            "image_size",
            "encoder_width",
            "encoder_depth",
            "d_model",
            "n_layers",
            "n_heads",
            "max_len",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"VQAConfig.{name} must be positive, got {getattr(self, name)}")
        if self.arch == "transformer" and (self.d_model % self.n_heads or self.d_model % 4):
            raise ValueError(
                f"d_model={self.d_model} must be divisible by n_heads={self.n_heads} "
                "and by 4 (2-D positions)"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VQAConfig:
        return cls(**d)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> VQAConfig:
        """A named size (``VQA_PRESETS``) with fields overridden."""
        if name not in VQA_PRESETS:
            raise ValueError(f"unknown VQA preset {name!r}; known: {sorted(VQA_PRESETS)}")
        return cls(**{**VQA_PRESETS[name], **overrides})


class _VQA(nn.Module):
    kind: ClassVar[str] = ""

    def __init__(self, config: VQAConfig) -> None:
        super().__init__()
        self.config = config

    def check_inputs(self, images: Tensor, questions: Tensor, lengths: Tensor) -> None:
        s = self.config.image_size
        if images.dim() != 4 or tuple(images.shape[1:]) != (3, s, s):
            raise UserError(f"VQA model expects images (B, 3, {s}, {s}), got {tuple(images.shape)}")
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
        if questions.shape[1] > self.config.max_len:
            raise UserError(
                f"question of {questions.shape[1]} tokens is longer than max_len="
                f"{self.config.max_len}"
            )

    def _classifier(self, width: int) -> nn.Sequential:
        c = self.config
        return nn.Sequential(
            nn.Dropout(c.dropout),
            nn.Linear(width, 2 * c.d_model),
            nn.ReLU(),
            nn.Linear(2 * c.d_model, c.n_answers),
        )


class LSTMVQA(_VQA):
    """Question LSTM + CNN image vector, fused by concatenation or product (or blind)."""

    kind: ClassVar[str] = "vqa_lstm"

    def __init__(self, config: VQAConfig) -> None:
        super().__init__(config)
        c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model, padding_idx=0)
        self.lstm = nn.LSTM(c.d_model, c.d_model, num_layers=c.n_layers, batch_first=True)
        if c.fusion == "none":
            self.encoder, self.img_proj = nn.Identity(), nn.Identity()
        else:
            self.encoder = build_image_encoder(
                c.encoder, c.image_size, c.encoder_width, c.encoder_depth, patch_size=c.patch_size
            )
            freeze_unused(self.encoder, "features")
            n_tokens = self._n_tokens()
            self.img_proj = nn.Sequential(
                nn.Linear(n_tokens * self.encoder.feature_dim, c.d_model), nn.ReLU()
            )
        self.head = self._classifier(2 * c.d_model if c.fusion == "concat" else c.d_model)

    def _n_tokens(self) -> int:
        with torch.no_grad():
            was = self.encoder.training
            probe = self.encoder.eval().features(
                torch.zeros(1, 3, self.config.image_size, self.config.image_size)
            )
            self.encoder.train(was)
        return probe.shape[1]

    def question_vector(self, questions: Tensor, lengths: Tensor) -> Tensor:
        """The LSTM's last hidden state at each question's true end, ``(B, D)``."""
        packed = nn.utils.rnn.pack_padded_sequence(
            self.tok_emb(questions), lengths.cpu(), batch_first=True, enforce_sorted=False
        )
        _, (h, _) = self.lstm(packed)  # h (layers, B, D)
        return h[-1]

    def image_vector(self, images: Tensor) -> Tensor:
        """``(B, D)`` from the flattened grid of image tokens (keeps positions)."""
        return self.img_proj(self.encoder.features(images).flatten(1))  # (B, N·C) -> (B, D)

    def forward(self, images: Tensor, questions: Tensor, lengths: Tensor) -> Tensor:
        """Answer logits ``(B, A)``; the blind model never looks at ``images``."""
        self.check_inputs(images, questions, lengths)
        q = self.question_vector(questions, lengths)
        fusion = self.config.fusion
        if fusion == "none":
            z = q
        elif fusion == "concat":
            z = torch.cat((self.image_vector(images), q), dim=-1)  # (B, 2D)
        else:
            z = self.image_vector(images) * q  # (B, D)
        return self.head(z)


class TransformerVQA(_VQA):
    """Question tokens attend to each other and to the image tokens; mean-pool; classify."""

    kind: ClassVar[str] = "vqa_transformer"

    def __init__(self, config: VQAConfig) -> None:
        super().__init__(config)
        c = config
        self.encoder = build_image_encoder(
            c.encoder, c.image_size, c.encoder_width, c.encoder_depth, patch_size=c.patch_size
        )
        freeze_unused(self.encoder, "features")
        self.img_proj = nn.Linear(self.encoder.feature_dim, c.d_model)
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = LearnedPositionalEmbedding(c.max_len, c.d_model)
        self.blocks = nn.ModuleList(
            build_block(
                c.d_model,
                c.n_heads,
                ffn="mlp",
                ffn_hidden=2 * c.d_model,
                activation="gelu",
                norm="layernorm",
                norm_position="pre",
                dropout=c.dropout,
                cross_attention=True,
                context_dim=c.d_model,
            )
            for _ in range(c.n_layers)
        )
        self.norm_f = make_norm("layernorm", c.d_model)
        self.head = self._classifier(c.d_model)
        self.cross_weights: list[Tensor] = []

    def image_tokens(self, images: Tensor) -> Tensor:
        feats = self.encoder.features(images)  # (B, N, C)
        n = feats.shape[1]
        g = math.isqrt(n)
        return self.img_proj(feats) + sincos_2d(g, n // g, self.config.d_model).to(feats)

    def forward(
        self, images: Tensor, questions: Tensor, lengths: Tensor, *, need_weights: bool = False
    ) -> Tensor:
        """Answer logits ``(B, A)``; ``need_weights`` keeps each block's ``(B, H, L, N)``
        cross-attention in ``cross_weights``."""
        self.check_inputs(images, questions, lengths)
        B, L = questions.shape
        real = torch.arange(L, device=questions.device)[None, :] < lengths[:, None]  # (B, L)
        x = self.tok_emb(questions) + self.pos_emb(torch.arange(L, device=questions.device))
        memory = self.image_tokens(images)
        weights = []
        for blk in self.blocks:
            x = blk(x, mask=real[:, None, None, :], context=memory, need_weights=need_weights)
            if need_weights:
                weights.append(blk.cross_weights)
        self.cross_weights = weights
        x = self.norm_f(x)
        pooled = (x * real[..., None]).sum(1) / lengths[:, None].to(x.dtype)  # (B, D)
        return self.head(pooled)


def build_vqa(config: VQAConfig) -> _VQA:
    """The VQA model named by ``config.arch``."""
    return LSTMVQA(config) if config.arch == "lstm" else TransformerVQA(config)


def _load_vocab(run_dir):
    from attnlab.data.scenes import Vocab

    return Vocab.load(run_dir / "vocab.json")


register_kind(LSTMVQA.kind, VQAConfig, LSTMVQA, artifacts="scene_vocab")
register_kind(TransformerVQA.kind, VQAConfig, TransformerVQA, artifacts="scene_vocab")
