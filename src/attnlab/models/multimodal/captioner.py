"""Image captioning: a CNN + LSTM captioner and an image-token + Transformer-decoder captioner.

CNN + LSTM (Show and Tell style, the lecture's pipeline): the image encoder's penultimate features
(or, for the experiment, its class logits) go through a linear layer into the LSTM's initial state
h₀, c₀; the decoder reads ``<start>`` and emits one word per step until ``<end>``:

    h₀, c₀ = tanh(W_h f), W_c f           f = image features (B, F)
    h_t = LSTM(h_{t-1}, E[w_{t-1}])       p(w_t | w_<t, image) = softmax(W_o h_t)

Transformer: the image becomes a grid of tokens with 2-D positions (the trunk of
:mod:`~attnlab.models.multimodal.trunk`); a causal decoder over the words cross-attends to them,
so every generated word has a map of where it looked:

    x = E[w] + P;  x = x + SelfAttn_causal(x);  x = x + CrossAttn(x, image tokens);  x = x + FFN(x)

Both implement the incremental-decoding interface of :mod:`attnlab.decoding`
(``start_decoding(images, max_len)`` / ``decode_step(tokens, state)``), so greedy and beam search
are :func:`attnlab.decoding.search.beam_search`. The Transformer keeps a self-attention KV cache
and a cross-attention cache of the image tokens' keys/values per block; the LSTM carries (h, c).
``<end>`` (not the full stop) ends a caption.

Shape legend: B batch, L caption length, V vocabulary, N image tokens, F feature vector width,
D d_model, Y decoder layers, H heads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from attnlab.attention.cache import DecodeState, KVCache
from attnlab.attention.capture import AttentionMaps, capture_attention
from attnlab.config.multimodal import CaptionConfig
from attnlab.layers.rnn import stacked_rnn
from attnlab.models.multimodal.encoders import ImageEncoder, upgrade_weights
from attnlab.models.multimodal.prefix import PrefixCaptioner
from attnlab.models.multimodal.trunk import ImageTextTransformer
from attnlab.models.registry import register_kind

__all__ = [
    "LSTMCaptioner",
    "TransformerCaptioner",
    "LSTMCaptionState",
    "TransformerCaptionState",
    "build_captioner",
]


def _check_tokens(tokens: Tensor, max_len: int, past: int = 0) -> None:
    if tokens.dim() != 2:
        raise ValueError(f"tokens must be (B, L), got {tuple(tokens.shape)}")
    if past + tokens.shape[1] > max_len:
        raise ValueError(
            f"caption of {past + tokens.shape[1]} tokens is longer than max_len={max_len}"
        )


def _decode_length(config: CaptionConfig, max_len: int | None) -> int:
    max_len = config.max_len if max_len is None else max_len
    if not 1 <= max_len <= config.max_len:
        raise ValueError(f"max_len must be in [1, {config.max_len}], got {max_len}")
    return max_len


@dataclass
class LSTMCaptionState(DecodeState):
    """Incremental decoding of an :class:`LSTMCaptioner`: the recurrent state, batch first."""

    h: Tensor  # (B, Y, D)
    c: Tensor  # (B, Y, D)


@dataclass
class TransformerCaptionState(DecodeState):
    """Incremental decoding of a :class:`TransformerCaptioner`.

    Attributes:
        memory: the image tokens ``(B, N, D)`` until the first step has put their keys and values
            into ``cross_caches`` (then None).
        caches: one self-attention KV cache per block (the words so far).
        cross_caches: one cross-attention KV cache per block (the image tokens).
    """

    memory: Tensor | None
    caches: list[KVCache]
    cross_caches: list[KVCache]


class LSTMCaptioner(nn.Module):
    """CNN features -> LSTM initial state -> one word per step (see the module docstring)."""

    kind: ClassVar[str] = "caption_lstm"

    def __init__(self, config: CaptionConfig) -> None:
        super().__init__()
        self.config = c = config
        logits = c.features == "logits"
        self.encoder = ImageEncoder(
            c,
            num_classes=c.num_classes,
            reads="logits" if logits else "vector",
            frozen=c.freeze_encoder,
        )
        f = c.num_classes if logits else self.encoder.feature_dim
        self.init_h = nn.Linear(f, c.n_layers * c.d_model)
        self.init_c = nn.Linear(f, c.n_layers * c.d_model)
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.lstm = stacked_rnn("lstm", c.d_model, c.d_model, c.n_layers, dropout=c.dropout)
        self.drop = nn.Dropout(c.dropout)
        self.head = nn.Linear(c.d_model, c.vocab_size)

    def image_vector(self, images: Tensor) -> Tensor:
        """``(B, F)``: penultimate features or class logits, as configured."""
        if self.config.features == "logits":
            return self.encoder.logits(images)  # (B, num_classes)
        return self.encoder.vector(images)  # (B, C)

    def initial_state(self, images: Tensor) -> LSTMCaptionState:
        """``h₀, c₀`` from the image, each ``(B, Y, D)`` (batch first, so beams reorder)."""
        f = self.image_vector(images)
        B, Y, D = f.shape[0], self.config.n_layers, self.config.d_model
        h = torch.tanh(self.init_h(f)).view(B, Y, D)  # (B, Y, D)
        c = self.init_c(f).view(B, Y, D)  # (B, Y, D)
        return LSTMCaptionState(h, c)

    def run_words(self, tokens: Tensor, state: LSTMCaptionState) -> tuple[Tensor, LSTMCaptionState]:
        """Logits ``(B, L, V)`` of ``tokens (B, L)`` read from ``state``, and the state after them
        (what truncated backpropagation through time runs window by window)."""
        return self._run(tokens, state)

    def _run(self, tokens: Tensor, state: LSTMCaptionState) -> tuple[Tensor, LSTMCaptionState]:
        h, c = (s.transpose(0, 1).contiguous() for s in (state.h, state.c))  # (Y, B, D)
        out, (h, c) = self.lstm(self.drop(self.tok_emb(tokens)), (h, c))  # out (B, L, D)
        return self.head(self.drop(out)), LSTMCaptionState(h.transpose(0, 1), c.transpose(0, 1))

    def forward(self, images: Tensor, tokens: Tensor) -> Tensor:
        """Teacher-forced logits ``(B, L, V)`` for ``tokens (B, L)`` starting with ``<start>``."""
        _check_tokens(tokens, self.config.max_len)
        return self._run(tokens, self.initial_state(images))[0]

    # -- incremental decoding (the interface of attnlab.decoding) -------------------------------

    def start_decoding(self, images: Tensor, max_len: int | None = None) -> LSTMCaptionState:
        """The state after reading ``images (B, 3, H, W)``; captions of up to ``max_len`` tokens."""
        _decode_length(self.config, max_len)
        return self.initial_state(images)

    def decode_step(
        self, tokens: Tensor, state: LSTMCaptionState
    ) -> tuple[Tensor, LSTMCaptionState]:
        """Feed ``tokens (B, T)``; return the next word's logits ``(B, V)`` and the new state."""
        logits, state = self._run(tokens, state)
        return logits[:, -1], state


class TransformerCaptioner(ImageTextTransformer):
    """Image tokens + causal Transformer decoder with cross-attention (module docstring).

    Attributes (besides the trunk's): ``head``, the ``(D -> V)`` output projection.
    """

    kind: ClassVar[str] = "caption_transformer"

    def __init__(self, config: CaptionConfig) -> None:
        encoder = ImageEncoder(
            config, num_classes=config.num_classes, reads="tokens", frozen=config.freeze_encoder
        )
        super().__init__(config, encoder)
        self.head = nn.Linear(config.d_model, config.vocab_size)

    def forward(
        self, images: Tensor, tokens: Tensor, *, need_weights: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Teacher-forced logits ``(B, L, V)`` for ``tokens (B, L)`` starting with ``<start>``.

        Args:
            need_weights: also return each block's cross-attention ``(B, H, L, N)``: row t is
                where the decoder looked while predicting word t + 1 (a distribution over the
                image tokens), read through :func:`attnlab.attention.capture_attention`.
        """
        if need_weights:
            with capture_attention(self) as maps:
                logits = self(images, tokens)
            return logits, maps.select("cross_attn")
        _check_tokens(tokens, self.config.max_len)
        hidden = self.run_text(tokens, self.image_tokens(images), is_causal=True)
        return self.head(hidden)

    def word_attention(self, images: Tensor, tokens: Tensor, *, layer: int = -1) -> Tensor:
        """Where the decoder looked for each word, ``(B, L, Gh, Gw)``: the head-averaged
        cross-attention of ``layer`` while predicting word t + 1 from ``tokens[:, :t + 1]``."""
        _, weights = self(images, tokens, need_weights=True)
        w = weights[layer].mean(1)  # (B, L, N)
        return w.view(*w.shape[:2], *self.encoder.grid)  # (B, L, Gh, Gw)

    @staticmethod
    def step_attention(maps: AttentionMaps) -> Tensor:
        """From one decoding step's capture: the last block's head-averaged cross-attention of
        the newest word, ``(B, N)`` (what :func:`attnlab.decoding.search.beam_search` keeps)."""
        return maps.select("cross_attn")[-1].mean(1)[:, -1]

    # -- incremental decoding (the interface of attnlab.decoding) -------------------------------

    def start_decoding(self, images: Tensor, max_len: int | None = None) -> TransformerCaptionState:
        """Encode ``images (B, 3, H, W)`` once and allocate the caches for ``max_len`` tokens."""
        max_len = _decode_length(self.config, max_len)
        memory = self.image_tokens(images)  # (B, N, D)
        B, N = memory.shape[:2]
        return TransformerCaptionState(
            memory=memory,
            caches=[blk.attn.make_cache(B, max_len) for blk in self.blocks],
            cross_caches=[blk.cross_attn.make_cache(B, N) for blk in self.blocks],
        )

    def decode_step(
        self, tokens: Tensor, state: TransformerCaptionState
    ) -> tuple[Tensor, TransformerCaptionState]:
        """Feed ``tokens (B, T)`` (``<start>`` first, then one word per step): only the new words
        are computed; earlier ones are read from the caches. Returns logits ``(B, V)``."""
        past = state.caches[0].length
        _check_tokens(tokens, state.caches[0].max_seq_len, past)
        hidden = self.run_text(
            tokens,
            state.memory,
            is_causal=tokens.shape[1] > 1,
            caches=state.caches,
            cross_caches=state.cross_caches,
        )
        state.memory = None  # the cross caches hold the image keys and values now
        return self.head(hidden[:, -1]), state


def build_captioner(config: CaptionConfig) -> nn.Module:
    """The captioner named by ``config.arch`` (``prefix``: :class:`~attnlab.models.multimodal.
    prefix.PrefixCaptioner`)."""
    if config.arch == "prefix":
        return PrefixCaptioner(config)
    return LSTMCaptioner(config) if config.arch == "lstm" else TransformerCaptioner(config)


for _cls in (LSTMCaptioner, TransformerCaptioner):
    register_kind(_cls.kind, CaptionConfig, _cls, artifacts="scene_vocab", upgrade=upgrade_weights)
