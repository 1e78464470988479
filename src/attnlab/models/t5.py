"""T5 (Raffel et al. 2020, "Exploring the Limits of Transfer Learning"): an encoder–decoder with
relative position biases, built from the shared Transformer block.

    memory = RMSNorm(Encoder(Emb(x), bias_enc))            N × [self-attention, FFN], pre-norm
    logits = Decoder(Emb(y_<t), memory, bias_dec) · d^-½ W_out          (1.0; 1.1: no d^-½)

What makes it T5 rather than the Transformer of :mod:`attnlab.models.seq2seq`, all fields of
:class:`~attnlab.config.T5Config` read by the builders:

- no absolute positions: each stack owns one :class:`~attnlab.layers.position.T5RelativeBias`
  (bidirectional buckets in the encoder, causal ones in the decoder), evaluated ONCE per forward
  pass and added to the scores of every layer's self-attention (``attn_bias``); cross-attention
  has none;
- scores ``q·k`` without the 1/√d factor (``attn_scale = 1``; the initialisation of W_Q carries
  it, std (d·d_kv)^-½ as in Mesh TensorFlow);
- RMS norm without bias or mean subtraction before each sub-layer and after each stack, no
  biases in the linear maps, no embedding scaling;
- the ReLU FFN of T5 1.0 or the gated GELU of 1.1 (``ffn="gated"``);
- 1.0 ties the output projection to the target embedding and scales the decoder output by
  d_model^-½ first; 1.1 unties it without the scaling.

It is called like attnlab's other seq2seq models, ``model(src, src_mask, tgt_in)``, and decodes
through :mod:`attnlab.decoding` (``start_decoding`` / ``decode_step``: one self- and one
cross-attention KV cache per decoder layer). Hugging Face ``T5ForConditionalGeneration``
checkpoints convert both ways (:mod:`attnlab.interop.hf.t5`).

Shape legend: B batch, S source length, T target length, C d_model, V target vocabulary, H heads.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from attnlab.attention.multihead import MultiHeadAttention
from attnlab.config.t5 import T5Config, T5SpanConfig
from attnlab.layers.block import run_blocks
from attnlab.layers.builders import build_positions
from attnlab.layers.hook import HookPoint
from attnlab.layers.position import T5RelativeBias
from attnlab.models.registry import register_kind
from attnlab.models.seq2seq import EncoderDecoder, Seq2SeqDecodeState

__all__ = ["T5Config", "T5", "T5SpanModel"]


class T5(EncoderDecoder):
    """T5 encoder–decoder built from a :class:`T5Config`.

    ``forward(src (B,S), src_mask (B,S) bool, tgt_in (B,T)) -> logits (B,T,V)`` (teacher forcing).

    Attributes:
        src_emb, tgt_emb: token embeddings (one module when ``share_embeddings``);
        enc_bias, dec_bias: the two relative-bias tables (``T5RelativeBias``, one per stack);
        encoder, decoder: ``nn.ModuleList`` of :class:`attnlab.layers.block.TransformerBlock`;
        enc_norm, dec_norm: the final RMS norms; lm_head: output projection (the target
        embedding when tied).
    """

    kind: ClassVar[str] = "t5"
    #: the decoder is not stepped during training (scheduled sampling uses two passes)
    recurrent: ClassVar[bool] = False

    def __init__(self, config: T5Config) -> None:
        super().__init__()
        self.config = c = config
        self.src_emb = nn.Embedding(c.src_vocab_size, c.d_model)
        self.tgt_emb = (
            self.src_emb if c.share_embeddings else nn.Embedding(c.tgt_vocab_size, c.d_model)
        )
        buckets = dict(num_buckets=c.num_buckets, max_distance=c.max_distance)
        self.enc_bias = build_positions(c.encoder_block, causal=False, **buckets)
        self.dec_bias = build_positions(c.decoder_block, causal=True, **buckets)
        self.drop = nn.Dropout(c.dropout)
        # hook points: token embeddings (B, S, C) / (B, T, C); see attnlab.inspect
        self.hook_src_embed, self.hook_tgt_embed = HookPoint(), HookPoint()
        self.build_stacks(c)
        self.lm_head = nn.Linear(c.d_model, c.tgt_vocab_size, bias=False)
        self.output_scale = c.d_model**-0.5 if c.scale_output else 1.0
        self.apply(self._init_weights)
        if c.tie_embeddings:
            self.lm_head.weight = self.tgt_emb.weight

    def _init_weights(self, m: nn.Module) -> None:
        # Mesh TensorFlow's T5 initialisation: N(0, 1/fan_in) for every matrix, W_Q's rows a
        # further 1/√d_kv smaller (the scale the scores do without), embeddings N(0, 1), the
        # bias tables N(0, 1/d_model). (transformers draws an untied head from N(0, 1); fan-in
        # keeps 1.1's logits at the scale of 1.0's scaled, tied ones.)
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=m.in_features**-0.5)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=1.0)
        elif isinstance(m, T5RelativeBias):
            nn.init.normal_(m.weight, std=self.config.d_model**-0.5)
        elif isinstance(m, MultiHeadAttention):  # children first: W_Q is already drawn
            proj = m.q_proj if m.cross else m.qkv
            with torch.no_grad():
                proj.weight[: m.n_heads * m.head_dim].mul_(m.head_dim**-0.5)

    # -- the two stacks
    def embed_source(self, src: Tensor) -> Tensor:
        return self.drop(self.hook_src_embed(self.src_emb(src)))

    def embed_target(self, tgt: Tensor, offset: int = 0) -> Tensor:
        # no absolute positions: ``offset`` (the cached length) only moves the relative bias,
        # which run_decoder reads from the caches
        return self.drop(self.hook_tgt_embed(self.tgt_emb(tgt)))

    def encode(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        """``memory (B, S, C)`` for ``src (B, S)``; ``src_mask (B, S)`` True = real token."""
        x = self.embed_source(src)
        S = src.shape[1]
        bias = self.enc_bias(S, S)  # (1, H, S, S), once for every layer
        mask = None if src_mask is None else src_mask[:, None, None, :]  # (B, 1, 1, S)
        x = run_blocks(self.encoder, x, mask=mask, attn_bias=bias)
        return self.drop(self.enc_norm(x))

    def run_decoder(
        self,
        y: Tensor,
        memory: Tensor,
        src_mask: Tensor | None,
        *,
        state: Seq2SeqDecodeState | None = None,
    ) -> Tensor:
        """Decoder stack on embedded ``y (B, T, C)`` (after ``past`` cached positions): causal
        self-attention with the decoder's bias, cross-attention to ``memory (B, S, C)``."""
        past = 0 if state is None else state.self_caches[0].length
        T = y.shape[1]
        bias = self.dec_bias(T, past + T, past=past)  # (1, H, T, past + T), once for all layers
        y = self.decoder_blocks(y, memory, src_mask, state, attn_bias=bias)
        return self.drop(self.dec_norm(y))

    def head(self, y: Tensor) -> Tensor:
        """Logits ``(..., V)`` of decoder outputs ``y (..., C)``: ``(y · d^-½) W_out`` (1.0)."""
        return self.lm_head(y * self.output_scale)


class T5SpanModel(T5):
    """:class:`T5` pre-trained by span corruption on a corpus (``attnlab train t5-span``): the
    same model; its run holds a tokenizer (with the sentinels) instead of two vocabularies."""

    kind: ClassVar[str] = "t5_span"


register_kind(T5.kind, T5Config, T5, artifacts="translation_vocab")
register_kind(T5SpanModel.kind, T5SpanConfig, T5SpanModel, artifacts="tokenizer")
