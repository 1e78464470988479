"""The Transformer encoder–decoder of "Attention Is All You Need" (Vaswani et al., 2017).

    memory = Encoder(Emb_src(x)·√d + PE)                    N × [self-attention, FFN]
    logits = Decoder(Emb_tgt(y_<t)·√d + PE, memory) W_out   N × [causal self-attn, cross-attn, FFN]

The defaults are the paper's: post-norm residuals, sinusoidal positions, ReLU FFN, encoder
self-attention that ignores source padding, decoder self-attention that is causal, and
cross-attention from every decoder position to the (unpadded) encoder outputs. Pre-norm, RoPE,
ALiBi, learned positions, RMSNorm, SwiGLU, MoE... are fields of :class:`Seq2SeqConfig` (a
:class:`attnlab.config.BlockConfig`): every block is built by :func:`attnlab.layers.builders.build_block`,
the block the decoder-only LM and ViT use. Positions go through the one interface of
:mod:`attnlab.layers.position`: the model owns one position module (``pos_emb``) whose ``embed``
adds absolute positions and whose ``rotate``/``bias`` (RoPE, ALiBi) the blocks' self-attention
applies; cross-attention takes no positions.

For decoding (:mod:`attnlab.decoding`), :meth:`Seq2SeqTransformer.start_decoding` encodes the
source once and makes one self-attention KV cache and one cross-attention KV cache per decoder
layer; each :meth:`~Seq2SeqTransformer.decode_step` then costs one new query per layer.

Shape legend: B batch, S source length, T target length, C d_model, V target vocabulary,
L decoder layers, H heads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from attnlab.attention.cache import DecodeState, KVCache
from attnlab.attention.capture import capture_attention
from attnlab.config.translation import Seq2SeqConfig
from attnlab.layers.block import run_blocks
from attnlab.layers.builders import build_block, build_final_norm, build_positions
from attnlab.layers.drop_path import drop_path_rates
from attnlab.layers.hook import HookPoint
from attnlab.models.registry import register_kind

__all__ = ["Seq2SeqConfig", "Seq2SeqTransformer", "Seq2SeqDecodeState", "EncoderDecoder"]


@dataclass
class Seq2SeqDecodeState(DecodeState):
    """Incremental decoding of a :class:`Seq2SeqTransformer`: the encoder output, the source
    mask and one self- and one cross-attention KV cache per decoder layer."""

    memory: Tensor  # (B, S, C)
    src_mask: Tensor  # (B, S) bool, True = real token
    self_caches: list[KVCache]
    cross_caches: list[KVCache]


class EncoderDecoder(nn.Module):
    """What attnlab's encoder–decoders share once their stacks are built: teacher forcing and
    incremental decoding over ``encode``, ``embed_target``, ``run_decoder`` and ``head``, with
    one self- and one cross-attention KV cache per decoder layer (:class:`Seq2SeqDecodeState`).

    A subclass defines ``encoder``/``decoder`` (``nn.ModuleList`` of blocks whose attention
    modules are ``attn`` and ``cross_attn``), ``encode(src, src_mask)``,
    ``embed_target(tokens, offset)`` and ``run_decoder(y, memory, src_mask, state=...)``;
    ``head`` defaults to ``lm_head``.
    """

    def build_stacks(self, config: Any) -> None:
        """``encoder`` and ``decoder`` (its blocks with cross-attention), ``enc_norm`` and
        ``dec_norm`` from ``config.encoder_block`` / ``decoder_block`` (one block config per
        stack); the blocks take the model's shared position module (or bias) in ``forward``."""
        c = config
        enc, dec = c.encoder_block, c.decoder_block
        self.encoder = nn.ModuleList(
            build_block(enc, shared_positions=True, drop_path=p, max_seq_len=c.max_seq_len)
            for p in drop_path_rates(enc.drop_path, c.n_enc_layers)
        )
        self.decoder = nn.ModuleList(
            build_block(
                dec,
                cross_attention=True,
                shared_positions=True,
                drop_path=p,
                max_seq_len=c.max_seq_len,
            )
            for p in drop_path_rates(dec.drop_path, c.n_dec_layers)
        )
        self.enc_norm = build_final_norm(enc, c.final_norm)
        self.dec_norm = build_final_norm(dec, c.final_norm)

    def decoder_blocks(
        self,
        y: Tensor,
        memory: Tensor,
        src_mask: Tensor | None,
        state: Seq2SeqDecodeState | None,
        **positions: Any,
    ) -> Tensor:
        """The decoder's blocks on ``y (B, T, C)``: causal self-attention (reading and extending
        ``state``'s caches when decoding), cross-attention to ``memory (B, S, C)`` restricted to
        the real source positions; ``positions`` (``pos_emb=`` or ``attn_bias=``) go to every
        block."""
        ctx_mask = None if src_mask is None else src_mask[:, None, None, :]  # (B, 1, 1, S)
        return run_blocks(
            self.decoder,
            y,
            caches=None if state is None else state.self_caches,
            cross_caches=None if state is None else state.cross_caches,
            is_causal=True,
            context=memory,
            context_mask=ctx_mask,
            **positions,
        )

    def head(self, y: Tensor) -> Tensor:
        """Logits ``(..., V)`` of decoder outputs ``y (..., C)``."""
        return self.lm_head(y)

    def forward(
        self, src: Tensor, src_mask: Tensor, tgt_in: Tensor, *, need_weights: bool = False
    ) -> Tensor | tuple[Tensor, dict[str, list[Tensor]]]:
        """Teacher-forced logits ``(B, T, V)`` for ``tgt_in = <start> y_1 … y_{T-1}``.

        Args:
            src: ``(B, S)`` source ids; src_mask: ``(B, S)`` True for real tokens.
            tgt_in: ``(B, T)`` decoder input ids.
            need_weights: also return the attention weights of every layer (math path).

        Returns:
            logits, or with ``need_weights`` ``(logits, {"encoder": [(B, H, S, S)] * N_enc,
            "decoder": [(B, H, T, T)] * N_dec, "cross": [(B, H, T, S)] * N_dec})``.
        """
        if need_weights:
            with capture_attention(self) as maps:
                logits = self(src, src_mask, tgt_in)
            enc = range(len(self.encoder))
            dec = range(len(self.decoder))
            return logits, {
                "encoder": [maps[f"encoder.{i}.attn"] for i in enc],
                "decoder": [maps[f"decoder.{i}.attn"] for i in dec],
                "cross": [maps[f"decoder.{i}.cross_attn"] for i in dec],
            }
        memory = self.encode(src, src_mask)
        return self.head(self.run_decoder(self.embed_target(tgt_in), memory, src_mask))

    # -- incremental decoding (the interface of attnlab.decoding)
    def start_decoding(self, src: Tensor, src_mask: Tensor, max_len: int) -> Seq2SeqDecodeState:
        """Encode once and allocate per-layer self/cross KV caches for ``max_len`` tokens
        (the start token included)."""
        memory = self.encode(src, src_mask)
        B, S = src.shape
        return Seq2SeqDecodeState(
            memory=memory,
            src_mask=src_mask,
            self_caches=[b.attn.make_cache(B, max_len) for b in self.decoder],
            cross_caches=[b.cross_attn.make_cache(B, S) for b in self.decoder],
        )

    def decode_step(
        self, tokens: Tensor, state: Seq2SeqDecodeState
    ) -> tuple[Tensor, Seq2SeqDecodeState]:
        """Feed ``tokens (B, T)`` (``<start>`` first, then one token per step).

        Returns:
            ``(logits (B, V) of the next token, state)``; the caches advance by T.
        """
        past = state.self_caches[0].length
        y = self.embed_target(tokens, offset=past)  # (B, T, C)
        y = self.run_decoder(y, state.memory, state.src_mask, state=state)
        return self.head(y[:, -1]), state


class Seq2SeqTransformer(EncoderDecoder):
    """Transformer encoder–decoder built from a :class:`Seq2SeqConfig`.

    ``forward(src (B,S), src_mask (B,S) bool, tgt_in (B,T)) -> logits (B,T,V)`` (teacher forcing).

    Attributes:
        src_emb, tgt_emb: token embeddings; pos_emb: the position module (shared by both stacks);
        encoder, decoder: ``nn.ModuleList`` of :class:`attnlab.layers.block.TransformerBlock` (the
        decoder's with cross-attention); enc_norm, dec_norm: final norms (``nn.Identity`` without
        ``final_norm``); lm_head: output projection (the target embedding when tied).
    """

    kind: ClassVar[str] = "transformer"
    #: the decoder is not stepped during training (scheduled sampling uses two passes)
    recurrent: ClassVar[bool] = False

    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__()
        self.config = c = config
        self.src_emb = nn.Embedding(c.src_vocab_size, c.d_model, padding_idx=c.pad_id)
        self.tgt_emb = nn.Embedding(c.tgt_vocab_size, c.d_model, padding_idx=c.pad_id)
        self.pos_emb = build_positions(c)
        self.drop = nn.Dropout(c.dropout)
        # hook points: scaled token embeddings (B, S, C) / (B, T, C); see attnlab.inspect
        self.hook_src_embed, self.hook_tgt_embed = HookPoint(), HookPoint()
        self.build_stacks(c)
        self.lm_head = nn.Linear(c.d_model, c.tgt_vocab_size, bias=False)
        self.apply(self._init_weights)
        if c.tie_embeddings:
            self.lm_head.weight = self.tgt_emb.weight

    def _init_weights(self, m: nn.Module) -> None:
        # Xavier-uniform for matrices (the reference implementations' choice), N(0, d^-1/2) for
        # embeddings so that ×√d brings them to unit scale.
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=self.config.d_model**-0.5)
            if m.padding_idx is not None:
                with torch.no_grad():
                    m.weight[m.padding_idx].zero_()

    # -- embeddings
    def _embed(self, emb: nn.Embedding, ids: Tensor, offset: int = 0) -> Tensor:
        T = ids.shape[1]
        if offset + T > self.config.max_seq_len and self.pos_emb.absolute:
            raise ValueError(
                f"sequence of length {offset + T} exceeds max_seq_len={self.config.max_seq_len}"
            )
        x = emb(ids)  # (B, T, C)
        if self.config.scale_embeddings:
            x = x * math.sqrt(self.config.d_model)
        positions = torch.arange(offset, offset + T, device=ids.device)  # (T,)
        hook = self.hook_src_embed if emb is self.src_emb else self.hook_tgt_embed
        return self.drop(self.pos_emb.embed(hook(x), positions))

    def embed_source(self, src: Tensor) -> Tensor:
        return self._embed(self.src_emb, src)

    def embed_target(self, tgt: Tensor, offset: int = 0) -> Tensor:
        return self._embed(self.tgt_emb, tgt, offset)

    # -- the two stacks on embedded inputs (used by the parity test against torch.nn.Transformer)
    def run_encoder(self, x: Tensor, src_mask: Tensor | None) -> Tensor:
        """Encoder stack on embedded ``x (B, S, C)``; ``src_mask (B, S)`` True = real token."""
        mask = None if src_mask is None else src_mask[:, None, None, :]  # (B, 1, 1, S)
        for block in self.encoder:
            x = block(x, mask=mask, pos_emb=self.pos_emb)
        return self.enc_norm(x)

    def run_decoder(
        self,
        y: Tensor,
        memory: Tensor,
        src_mask: Tensor | None,
        *,
        state: Seq2SeqDecodeState | None = None,
    ) -> Tensor:
        """Decoder stack on embedded ``y (B, T, C)``: causal self-attention, cross-attention to
        ``memory (B, S, C)`` restricted to the real source positions; with a decoding ``state``
        its KV caches are read and extended."""
        return self.dec_norm(self.decoder_blocks(y, memory, src_mask, state, pos_emb=self.pos_emb))

    # -- training
    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        """``memory (B, S, C)`` for ``src (B, S)``."""
        return self.run_encoder(self.embed_source(src), src_mask)


register_kind(
    Seq2SeqTransformer.kind, Seq2SeqConfig, Seq2SeqTransformer, artifacts="translation_vocab"
)
