"""Encoder-only (BERT-style) Transformer with a masked-LM head.

    h⁰ = Norm_emb(E[x] + P[positions] + S[token types])   token, position, segment embeddings
    hˡ = Block_l(hˡ⁻¹), bidirectional self-attention      l = 1 … L (post- or pre-norm)
    features = norm_f(hᴸ)                                  BertModel's last hidden state
    logits   = Norm(act(features W_t + b_t)) Eᵀ + b        the MLM head, decoder tied to E

Every position attends to every real token, before and after it (no causal mask); padded keys
are masked out through ``attention_mask`` (True = real token). Positions go through the one
interface of :mod:`attnlab.layers.position` (the model owns ``pos_emb``; learned, as BERT, by
default), so RoPE/ALiBi/T5 encoders come from the config alone.

Shape legend: B batch, T tokens, C d_model, V vocab_size, H heads.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from attnlab.attention.capture import capture_attention
from attnlab.config.encoder import EncoderConfig
from attnlab.layers.block import ACTIVATIONS, make_norm
from attnlab.layers.builders import build_block, build_final_norm, build_positions
from attnlab.layers.hook import HookPoint
from attnlab.models.registry import register_kind

__all__ = ["EncoderMLM", "MLMHead"]


class MLMHead(nn.Module):
    """BERT's prediction head: ``Norm(act(h W_t + b_t)) W_decᵀ + b``.

    Args:
        d_model: C.
        vocab_size: V.
        activation: the transform's activation (``gelu`` | ``gelu_tanh`` | ``relu`` | ``silu``).
        norm, norm_eps, bias: the transform's norm (``layernorm`` | ``rmsnorm``), its ε, biases.

    Attributes:
        dense, norm: the transform (HF ``cls.predictions.transform.dense`` / ``.LayerNorm``).
        decoder: ``nn.Linear(C, V, bias=False)``; the model ties its weight to the embeddings.
        bias: the output bias ``(V,)`` (HF ``cls.predictions.bias``).
    """

    def __init__(
        self,
        d_model: int,
        vocab_size: int,
        *,
        activation: str = "gelu",
        norm: str = "layernorm",
        norm_eps: float = 1e-12,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model, bias=bias)
        self.act = ACTIVATIONS[activation]
        self.norm = make_norm(norm, d_model, eps=norm_eps, bias=bias)
        self.decoder = nn.Linear(d_model, vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, h: Tensor) -> Tensor:
        """``(..., C) -> (..., V)`` logits."""
        return self.decoder(self.norm(self.act(self.dense(h)))) + self.bias


class EncoderMLM(nn.Module):
    """A bidirectional Transformer encoder with BERT's masked-LM head.

    Args:
        config: the model configuration (:class:`attnlab.config.EncoderConfig`).

    Attributes (a stable layout that :mod:`attnlab.interop.bert` maps to Hugging Face BERT):
        tok_emb: ``nn.Embedding(V, C)``.
        pos_emb: the position module (only the learned one has weights, ``pos_emb.weight``).
        type_emb: ``nn.Embedding(type_vocab_size, C)``, token types (segments A/B).
        emb_norm: the norm over the summed embeddings (``nn.Identity`` without ``embed_norm``).
        blocks: ``nn.ModuleList`` of :class:`~attnlab.layers.block.TransformerBlock`.
        norm_f: final norm of pre-norm encoders (``nn.Identity`` for post-norm ones).
        head: the :class:`MLMHead` (its decoder weight is ``tok_emb.weight`` when tied).

    MoE load-balancing losses are reported to :func:`attnlab.attention.collect_aux_losses`.
    """

    kind: ClassVar[str] = "encoder_mlm"

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = build_positions(c)  # bidirectional: T5's table has both sides
        self.type_emb = nn.Embedding(c.type_vocab_size, c.d_model)
        self.emb_norm = (
            make_norm(c.norm, c.d_model, eps=c.norm_eps, bias=c.bias)
            if c.embed_norm
            else nn.Identity()
        )
        self.drop = nn.Dropout(c.dropout)
        self.hook_embed = HookPoint()  # token embeddings (B, T, C); see attnlab.inspect
        self.blocks = nn.ModuleList(
            build_block(c, shared_positions=True) for _ in range(c.n_layers)
        )
        self.norm_f = build_final_norm(c)
        self.head = MLMHead(
            c.d_model,
            c.vocab_size,
            activation=c.activation,
            norm=c.norm,
            norm_eps=c.norm_eps,
            bias=c.bias,
        )
        self.reset_parameters()
        if c.tie_embeddings:
            self.head.decoder.weight = self.tok_emb.weight

    def reset_parameters(self) -> None:
        """BERT's initialisation: weights N(0, init_std), biases 0, norms 1 (as built)."""
        for name, p in self.named_parameters():
            if "norm" in name.rsplit(".", 2)[-2] and p.dim() == 1:
                continue  # norm weights stay 1, their biases 0
            if name.endswith("bias"):
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, std=self.config.init_std)

    def encode(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        """The features of every token (Hugging Face ``BertModel``'s ``last_hidden_state``).

        Args:
            input_ids: token ids ``(B, T)``.
            attention_mask: ``(B, T)``, True (or 1) = real token; padded tokens are never
                attended to (their own features are computed but mean nothing).
            token_type_ids: ``(B, T)`` segment ids below ``type_vocab_size`` (default all 0).

        Returns:
            ``(B, T, C)``.

        Raises:
            ValueError: wrong shapes, more than ``max_seq_len`` tokens, a token type out of range.
        """
        c = self.config
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (B, T) token ids, got {tuple(input_ids.shape)}")
        B, T = input_ids.shape
        if T > c.max_seq_len:
            raise ValueError(f"{T} tokens exceed the encoder's context max_seq_len={c.max_seq_len}")
        mask = None
        if attention_mask is not None:
            if attention_mask.shape != (B, T):
                raise ValueError(
                    f"attention_mask must be (B, T) = {(B, T)}, got {tuple(attention_mask.shape)}"
                )
            am = attention_mask.to(device=input_ids.device, dtype=torch.bool)
            mask = am[:, None, None, :]  # (B, 1, 1, T): broadcast over heads and queries
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        elif token_type_ids.shape != (B, T):
            raise ValueError(
                f"token_type_ids must be (B, T) = {(B, T)}, got {tuple(token_type_ids.shape)}"
            )
        elif (
            token_type_ids.numel()
            and not 0 <= int(token_type_ids.min()) <= int(token_type_ids.max()) < c.type_vocab_size
        ):
            raise ValueError(f"token_type_ids must lie in [0, {c.type_vocab_size})")
        positions = torch.arange(T, device=input_ids.device)  # (T,)
        x = self.pos_emb.embed(self.hook_embed(self.tok_emb(input_ids)), positions)  # (B, T, C)
        x = self.drop(self.emb_norm(x + self.type_emb(token_type_ids)))  # (B, T, C)
        for block in self.blocks:
            x = block(x, mask=mask, is_causal=False, positions=positions, pos_emb=self.pos_emb)
        return self.norm_f(x)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        *,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Masked-LM logits for every position (Hugging Face ``BertForMaskedLM``'s ``logits``).

        Args:
            input_ids, attention_mask, token_type_ids: as for :meth:`encode`.
            need_weights: also return each block's attention weights (the math path).

        Returns:
            logits ``(B, T, V)``; with ``need_weights``, ``(logits, weights)`` with one
            ``(B, H, T, T)`` tensor per block (padded keys get weight 0).

        Raises:
            ValueError: as :meth:`encode`.
        """
        if need_weights:
            with capture_attention(self) as maps:
                logits = self(input_ids, attention_mask, token_type_ids)
            return logits, maps.select("attn")
        return self.head(self.encode(input_ids, attention_mask, token_type_ids))

    def num_parameters(self, *, exclude_embeddings: bool = False) -> int:
        """Number of distinct parameters (tied weights counted once)."""
        seen = {id(p): p for p in self.parameters()}
        n = sum(p.numel() for p in seen.values())
        if exclude_embeddings:
            n -= self.tok_emb.weight.numel() + self.type_emb.weight.numel()
            n -= sum(p.numel() for p in self.pos_emb.parameters())
        return n


register_kind(EncoderMLM.kind, EncoderConfig, EncoderMLM, artifacts="tokenizer")
