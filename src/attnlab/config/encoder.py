"""Configs of the encoder-only (BERT-style) family: ``EncoderConfig`` (the model, with presets)
and ``MLMTaskConfig`` (masked-LM training data, config.json's ``"task"``).

    EncoderConfig.preset("bert-base")                 # BERT-base sizes (110M parameters)
    EncoderConfig.preset("tiny", norm_position="pre") # a CPU-sized encoder, pre-norm
    MLMTaskConfig(data="pydoc", tokenizer="char", seq_len=64, mask_prob=0.15)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from attnlab.config.base import Activation, ConfigError, NormPosition, TextStackConfig
from attnlab.config.lm import CorpusTaskConfig

__all__ = ["EncoderConfig", "MLMTaskConfig", "ENCODER_PRESETS"]

#: BERT's choices (Devlin et al. 2019): post-norm, exact GELU, LayerNorm ε 1e-12, learned positions
_BERT = dict(
    norm_position="post",
    activation="gelu",
    norm="layernorm",
    norm_eps=1e-12,
    position="learned",
    ffn="mlp",
    bias=True,
    type_vocab_size=2,
    embed_norm=True,
    tie_embeddings=True,
)
_SMALL_CTX = dict(vocab_size=256, max_seq_len=128)
_BERT_SIZE = dict(vocab_size=30522, max_seq_len=512, dropout=0.1, attn_dropout=0.1)

#: Named presets. ``tiny``, ``tiny-pre`` and ``tiny-rope`` run in CPU seconds; the ``bert-*`` sizes are those of the
#: BERT paper (base, large) and of Turc et al. 2019 (mini, small), with BERT's 30522 WordPiece
#: vocabulary, 512 positions and dropout 0.1.
ENCODER_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(_BERT, **_SMALL_CTX, d_model=64, n_layers=2, n_heads=4),
    "tiny-pre": dict(_BERT, **_SMALL_CTX, d_model=64, n_layers=2, n_heads=4, norm_position="pre"),
    # RoPE instead of learned positions: a small encoder trained from scratch on characters
    # leaves the unigram plateau within a few hundred steps (learned positions take far longer)
    "tiny-rope": dict(
        _BERT, **_SMALL_CTX, d_model=64, n_layers=2, n_heads=4, norm_position="pre", position="rope"
    ),
    "mini": dict(_BERT, **_SMALL_CTX, d_model=128, n_layers=4, n_heads=4),
    "bert-mini": dict(_BERT, **_BERT_SIZE, d_model=256, n_layers=4, n_heads=4),
    "bert-small": dict(_BERT, **_BERT_SIZE, d_model=512, n_layers=4, n_heads=8),
    "bert-base": dict(_BERT, **_BERT_SIZE, d_model=768, n_layers=12, n_heads=12),
    "bert-large": dict(_BERT, **_BERT_SIZE, d_model=1024, n_layers=24, n_heads=16),
}


@dataclass
class EncoderConfig(TextStackConfig):
    """A bidirectional Transformer encoder with a masked-LM head: the block and stack fields
    (:class:`~attnlab.config.base.TextStackConfig`) plus its own.

    Defaults are BERT's choices (post-norm, exact GELU, LayerNorm ε = 1e-12, learned positions,
    a LayerNorm over the summed embeddings, the MLM decoder tied to the token embeddings) at a
    CPU-friendly size. Every block field (GQA, RoPE/ALiBi/T5, SwiGLU, MoE, backends, Linformer)
    works as in the other families.

    Attributes:
        vocab_size: V, the special tokens included.
        type_vocab_size: rows of the token-type (segment) embedding (BERT: 2).
        embed_norm: a LayerNorm over token + position + token-type embeddings (BERT; a pre-norm
            encoder may leave it out).
        tie_embeddings: the MLM decoder's weight is the token embedding matrix.
    """

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = ENCODER_PRESETS

    activation: Activation = "gelu"
    norm_eps: float = 1e-12
    norm_position: NormPosition = "post"
    type_vocab_size: int = 2
    embed_norm: bool = True

    def validate(self) -> None:
        super().validate()
        self.positive("type_vocab_size")


@dataclass
class MLMTaskConfig(CorpusTaskConfig):
    """Masked-LM training on one corpus: what ``attnlab train mlm`` reads, tokenises and masks.

    A training example is ``[CLS] w₁ … w_{T−2} [SEP]`` (T = ``seq_len``, the model's context).
    Of the text positions, ``round(mask_prob · (T − 2))`` are chosen per example; a chosen
    position becomes ``[MASK]`` with probability ``mask_token``, a random (non-special) token with
    probability ``random_token`` and stays itself otherwise (BERT: 15 %, 80 / 10 / 10). The loss is
    the cross-entropy at the chosen positions only.

    The corpus fields are :class:`~attnlab.config.lm.CorpusTaskConfig`'s.

    Attributes:
        type: always ``"mlm"``.
        tokenizer: ``char`` or ``bpe``; the specials ``[PAD] [CLS] [SEP] [MASK]`` are added.
        vocab_size: the BPE vocabulary size before the specials (at least 256); a run records
            the plain tokenizer's actual size (for ``char``: the number of distinct characters).
        seq_len: tokens per example, ``[CLS]`` and ``[SEP]`` included (the model's context).
        seed: seeds window positions and masks (None: the training seed).
        val_fraction: the last fraction of the token ids held out for validation.
        mask_prob: the fraction of text positions chosen for prediction.
        mask_token, random_token: of the chosen positions, the fractions replaced by ``[MASK]``
            and by a random token (the rest keep their token).
    """

    type: Literal["mlm"] = "mlm"
    mask_prob: float = 0.15
    mask_token: float = 0.8
    random_token: float = 0.1

    def validate(self) -> None:
        super().validate()
        if self.seq_len < 3:
            raise ConfigError(
                f"seq_len must be at least 3 ([CLS], one token, [SEP]), got {self.seq_len}"
            )
        if not 0.0 < self.mask_prob <= 1.0:
            raise ConfigError(f"mask_prob must be in (0, 1], got {self.mask_prob!r}")
        for name in ("mask_token", "random_token"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name} must be in [0, 1], got {getattr(self, name)!r}")
        if self.mask_token + self.random_token > 1.0 + 1e-9:
            raise ConfigError(
                f"mask_token + random_token must not exceed 1, got {self.mask_token} + "
                f"{self.random_token}"
            )
