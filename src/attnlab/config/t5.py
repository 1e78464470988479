"""Configs of the T5 family (Raffel et al. 2020): the encoder–decoder and span-corruption
pre-training on a corpus.

    T5Config.preset("tiny", src_vocab_size=300, tgt_vocab_size=300, share_embeddings=True)
    T5Config.preset("t5-v1_1-small")          # gated-GELU FFN, untied head, no output scaling
    SpanTaskConfig(data="pydoc", noise_density=0.15, mean_span_length=3.0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from attnlab.config.base import Activation, ConfigError, FFNKind, NormKind, NormPosition
from attnlab.config.lm import CorpusTaskConfig
from attnlab.config.translation import Seq2SeqConfig

__all__ = ["T5Config", "T5SpanConfig", "T5_PRESETS", "SpanTaskConfig"]

#: T5 1.1's layout: gated-GELU FFN, untied output projection without the d_model^-0.5 scaling
_V1_1 = dict(ffn="gated", activation="gelu_tanh", tie_embeddings=False, scale_output=False)


def _t5(n_layers: int, d_model: int, n_heads: int, head_dim: int, d_ff: int, **more: Any):
    return dict(
        n_enc_layers=n_layers,
        n_dec_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        head_dim=head_dim,
        ffn_hidden=d_ff,
        **more,
    )


#: T5Config presets: ``t5-small`` / ``t5-base`` are the paper's sizes (1.0: ReLU FFN, tied and
#: scaled head), ``t5-v1_1-*`` the 1.1 layout; ``small`` trains in CPU minutes, ``tiny`` in
#: seconds (``tiny-v1_1`` is ``tiny`` in the 1.1 layout).
T5_PRESETS: dict[str, dict[str, Any]] = {
    "t5-small": _t5(6, 512, 8, 64, 2048),
    "t5-base": _t5(12, 768, 12, 64, 3072),
    "t5-v1_1-small": _t5(8, 512, 6, 64, 1024, **_V1_1),
    "t5-v1_1-base": _t5(12, 768, 12, 64, 2048, **_V1_1),
    "small": _t5(3, 128, 4, 32, 512, max_seq_len=128),
    "tiny": _t5(2, 64, 4, 16, 128, dropout=0.0, max_seq_len=64),
    "tiny-v1_1": _t5(2, 64, 4, 16, 128, dropout=0.0, max_seq_len=64, **_V1_1),
}


@dataclass
class T5Config(Seq2SeqConfig):
    """T5: an encoder–decoder of pre-norm blocks with relative position biases.

    The block fields are :class:`~attnlab.config.BlockConfig`'s, with T5's values as defaults:
    RMS norm (no bias, no mean subtraction, ε = 1e-6) before each sub-layer, no biases in the
    linear maps, scores ``q·k`` not scaled by 1/√d (``attn_scale = 1``: T5's initialisation folds
    the scale into W_Q), and ``position = "t5"``: one learned bias table per stack
    (bidirectional buckets in the encoder, causal buckets in the decoder), computed once per
    forward pass and added in every layer's self-attention. The FFN is T5 1.0's ReLU MLP
    (``ffn="mlp", activation="relu"``) or T5 1.1's gated GELU (``ffn="gated",
    activation="gelu_tanh"``). Embeddings are not scaled and there are no absolute positions.

    Attributes:
        num_buckets: relative-distance buckets of each table (32 in T5).
        max_distance: offsets at or beyond this share the last bucket (128 in T5).
        share_embeddings: one embedding matrix for the source and the target (T5's ``shared``;
            needs equal vocabularies). Off by default: translation pairs have two vocabularies.
        tie_embeddings: the output projection is the target embedding (T5 1.0; 1.1 unties it).
        scale_output: multiply the decoder output by d_model^-0.5 before the output projection
            (T5 1.0 does, with its tied embeddings; 1.1 does not).
        (the rest as in :class:`~attnlab.config.Seq2SeqConfig`; ``max_seq_len`` bounds the KV
        caches only, T5 has no position table of that length.)
    """

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = T5_PRESETS

    d_model: int = 512
    n_heads: int = 8
    ffn: FFNKind = "mlp"
    activation: Activation = "relu"
    norm: NormKind = "rmsnorm"
    norm_eps: float = 1e-6
    norm_position: NormPosition = "pre"
    position: Literal["t5"] = "t5"
    attn_scale: float | None = 1.0
    bias: bool = False
    dropout: float = 0.1
    final_norm: bool = True
    scale_embeddings: bool = False
    num_buckets: int = 32
    max_distance: int = 128
    share_embeddings: bool = False
    tie_embeddings: bool = True
    scale_output: bool = True

    def validate(self) -> None:
        super().validate()
        if self.num_buckets < 4:
            raise ConfigError(
                f"num_buckets must be at least 4 (two exact buckets on each side of the "
                f"encoder's table), got {self.num_buckets}"
            )
        if self.max_distance <= self.num_buckets // 2:
            raise ConfigError(
                f"max_distance ({self.max_distance}) must exceed num_buckets // 2 "
                f"({self.num_buckets // 2}), the decoder's exact range"
            )
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ConfigError(
                f"share_embeddings needs one vocabulary, got src_vocab_size={self.src_vocab_size}"
                f" and tgt_vocab_size={self.tgt_vocab_size}"
            )


@dataclass
class T5SpanConfig(T5Config):
    """:class:`T5Config` of a model pre-trained by span corruption on a corpus: one vocabulary
    (the tokenizer's, sentinels included), shared by the encoder, the decoder and the head.

    Attributes:
        vocab_size: V, from the tokenizer; ``src_vocab_size`` and ``tgt_vocab_size`` follow it.
        share_embeddings: on (one tokenizer on both sides, as in T5).
    """

    vocab_size: int = 1000
    share_embeddings: bool = True

    def validate(self) -> None:
        self.positive("vocab_size")
        self.src_vocab_size = self.tgt_vocab_size = self.vocab_size  # derived: one vocabulary
        super().validate()


@dataclass
class SpanTaskConfig(CorpusTaskConfig):
    """Span corruption on one corpus (T5's pre-training objective), config.json's ``task``.

    Windows of ``seq_len`` tokens are cut from the corpus; about ``noise_density`` of each
    window's tokens, in spans of mean length ``mean_span_length``, are replaced in the input by
    sentinels (one per span: ``<extra_id_0>``, ``<extra_id_1>``, ...), and the target lists the
    sentinels, each followed by the tokens it replaced, then ``</s>``.

    Attributes:
        type: always ``"t5-span"``.
        noise_density: the fraction of tokens corrupted (15 % in T5).
        mean_span_length: the mean length of a corrupted span (3 in T5).
        n_sentinels: sentinel tokens added to the tokenizer (at least the spans of one window).
        (the corpus fields as in :class:`~attnlab.config.CorpusTaskConfig`; ``seq_len`` is the
        uncorrupted window.)
    """

    type: Literal["t5-span"] = "t5-span"
    noise_density: float = 0.15
    mean_span_length: float = 3.0
    n_sentinels: int = 32

    def validate(self) -> None:
        super().validate()
        if not 0.0 < self.noise_density < 1.0:
            raise ConfigError(f"noise_density must be in (0, 1), got {self.noise_density!r}")
        if self.mean_span_length < 1.0:
            raise ConfigError(
                f"mean_span_length must be at least 1 token, got {self.mean_span_length!r}"
            )
        if self.seq_len < 4:
            raise ConfigError(f"seq_len must be at least 4 tokens, got {self.seq_len}")
        self.positive("n_sentinels")
        if self.n_sentinels < self.n_spans:
            raise ConfigError(
                f"n_sentinels ({self.n_sentinels}) is below the {self.n_spans} spans of a window of "
                f"seq_len={self.seq_len} (noise_density={self.noise_density}, mean_span_length="
                f"{self.mean_span_length}): raise n_sentinels"
            )

    @property
    def n_noise(self) -> int:
        """Corrupted tokens per window (at least one, leaving at least one)."""
        return min(max(1, round(self.seq_len * self.noise_density)), self.seq_len - 1)

    @property
    def n_spans(self) -> int:
        """Corrupted spans per window (at least one; never more than the noise tokens, nor than
        the kept tokens, which separate them)."""
        spans = round(self.n_noise / self.mean_span_length)
        return max(1, min(self.n_noise, self.seq_len - self.n_noise, spans))
