"""Decoder-only Transformer language model: GPT-2, Llama and Mixtral styles from one config.

    h⁰ = E[idx] (+ P[positions])                 token (+ absolute position) embeddings
    hˡ = Block_l(hˡ⁻¹), causal self-attention   l = 1 … L
    logits = norm_f(hᴸ) W_outᵀ                   W_out = E when embeddings are tied

The causal mask is always on; RoPE and ALiBi act inside attention. Left-padded batches are
supported through ``attention_mask`` (True = real token): padded keys are masked out and each
row's positions count only its real tokens, so a padded prompt behaves exactly like the prompt
alone. Incremental decoding passes one KV cache per block (:meth:`DecoderLM.make_caches`).

Shape legend: B batch, T new tokens, S = past + T keys, C d_model, V vocab_size, H heads.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from attnlab.attention.cache import KVCache
from attnlab.config import ModelConfig
from attnlab.layers.block import build_block
from attnlab.layers.moe import MoE
from attnlab.layers.norm import make_norm
from attnlab.layers.position import LearnedPositionalEmbedding, sinusoidal_table
from attnlab.runs import register_kind

__all__ = ["DecoderLM"]


class DecoderLM(nn.Module):
    """A decoder-only language model built from :class:`attnlab.ModelConfig`.

    Args:
        config: the model configuration (see :class:`attnlab.config.ModelConfig`).

    Attributes (a stable layout that :mod:`attnlab.interop` maps to Hugging Face names):
        tok_emb: ``nn.Embedding(V, C)``.
        pos_emb: :class:`LearnedPositionalEmbedding` when ``position == "learned"``, else absent.
        blocks: ``nn.ModuleList`` of :class:`TransformerBlock`.
        norm_f: final norm (``nn.Identity`` for post-norm models, whose blocks end normalised).
        lm_head: ``nn.Linear(C, V, bias=False)``; the Parameter ``tok_emb.weight`` when tied.
        aux_loss: the summed MoE load-balancing loss of the last forward (0 without MoE).
    """

    kind: ClassVar[str] = "decoder_lm"

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        if c.position == "learned":
            self.pos_emb = LearnedPositionalEmbedding(c.max_seq_len, c.d_model)
        elif c.position == "sinusoidal":
            self.register_buffer(
                "pos_table", sinusoidal_table(c.max_seq_len, c.d_model), persistent=False
            )
        self.drop = nn.Dropout(c.dropout)
        attn_position = c.position if c.position in ("rope", "alibi") else "none"
        self.blocks = nn.ModuleList(
            build_block(
                c.d_model,
                c.n_heads,
                n_kv_heads=c.n_kv_heads,
                head_dim=c.head_dim,
                ffn=c.ffn,
                ffn_hidden=c.ffn_hidden,
                activation=c.activation,
                n_experts=c.n_experts,
                top_k=c.top_k,
                norm=c.norm,
                norm_eps=c.norm_eps,
                norm_position=c.norm_position,
                bias=c.bias,
                qk_norm=c.qk_norm,
                position=attn_position,
                rope_theta=c.rope_theta,
                dropout=c.dropout,
                attn_dropout=c.attn_dropout,
                backend=c.backend,
                backend_options=c.backend_options,
            )
            for _ in range(c.n_layers)
        )
        self.norm_f = (
            make_norm(c.norm, c.d_model, eps=c.norm_eps, bias=c.bias)
            if c.norm_position == "pre"
            else nn.Identity()
        )
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.reset_parameters()
        if c.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.aux_loss: Tensor = torch.zeros(())

    def reset_parameters(self) -> None:
        """GPT-2 initialisation: N(0, init_std), residual projections scaled by 1/√(2L)."""
        std = self.config.init_std
        resid_std = std / math.sqrt(2 * self.config.n_layers)
        for name, p in self.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if "norm" in name and p.dim() == 1:
                continue  # norm weights stay 1, their biases 0 (as built)
            if leaf == "bias":
                nn.init.zeros_(p)
            elif name.endswith(("out_proj.weight", "fc2.weight", "down.weight", "w_out")):
                nn.init.normal_(p, std=resid_std)
            else:
                nn.init.normal_(p, std=std)

    def make_caches(
        self, batch_size: int, max_len: int | None = None, *, device=None, dtype=None
    ) -> list[KVCache]:
        """One empty KV cache per block, for ``batch_size`` rows and up to ``max_len`` tokens."""
        max_len = self.config.max_seq_len if max_len is None else max_len
        return [
            blk.attn.make_cache(batch_size, max_len, device=device, dtype=dtype)
            for blk in self.blocks
        ]

    def forward(
        self,
        idx: Tensor,
        *,
        attention_mask: Tensor | None = None,
        caches: list[KVCache] | None = None,
        positions: Tensor | None = None,
        need_weights: bool = False,
        logits_to_keep: int | None = None,
    ) -> Tensor:
        """Next-token logits for every position.

        Args:
            idx: token ids ``(B, T)``.
            attention_mask: ``(B, S)`` bool, True = real token, covering the cached tokens and
                these ``T``; left padding is how batches of unequal prompts are formed.
            caches: KV caches from :meth:`make_caches`; this call appends its T tokens.
            positions: absolute positions ``(T,)`` or ``(B, T)``; default: the count of earlier
                real tokens in the row (``past + arange(T)`` without a mask).
            need_weights: keep each block's attention weights in ``blocks[i].attn_weights``
                (uses the math attention path).
            logits_to_keep: compute logits for the last this many positions only (generation
                needs just the last one; the output projection is the costliest matmul).

        Returns:
            logits ``(B, T, V)``, or ``(B, logits_to_keep, V)``.

        Raises:
            ValueError: wrong shapes, a sequence longer than ``max_seq_len``, mismatched caches.
        """
        c = self.config
        if idx.dim() != 2:
            raise ValueError(f"idx must be (B, T) token ids, got shape {tuple(idx.shape)}")
        B, T = idx.shape
        past = 0
        if caches is not None:
            if len(caches) != len(self.blocks):
                raise ValueError(f"expected {len(self.blocks)} caches, got {len(caches)}")
            past = caches[0].length
        S = past + T
        if S > c.max_seq_len:
            raise ValueError(
                f"sequence of {S} tokens exceeds the context max_seq_len={c.max_seq_len}"
            )
        mask = None
        derived_positions = positions is None
        if attention_mask is not None:
            if attention_mask.shape != (B, S):
                raise ValueError(
                    f"attention_mask must be (B, past + T) = {(B, S)}, got "
                    f"{tuple(attention_mask.shape)}"
                )
            attention_mask = attention_mask.to(device=idx.device, dtype=torch.bool)
            if positions is None:
                # real-token positions: a left-padded row counts from its first real token
                positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past:]  # (B, T)
            mask = attention_mask[:, None, None, :]  # (B, 1, 1, S): broadcast over heads, queries
        elif positions is None:
            positions = torch.arange(past, S, device=idx.device)  # (T,)

        x = self.tok_emb(idx)  # (B, T, C)
        if c.position == "learned":
            x = x + self.pos_emb(positions)
        elif c.position == "sinusoidal":
            if positions.numel() and int(positions.max()) >= c.max_seq_len:
                raise ValueError(f"position {int(positions.max())} >= max_seq_len={c.max_seq_len}")
            x = x + self.pos_table[positions].to(x.dtype)
        x = self.drop(x)
        # ALiBi's bias depends only on the distance i − j, which padding does not change, and the
        # attention layer measures it in cache slots; give it slot positions unless told otherwise
        attn_positions = None if (c.position == "alibi" and derived_positions) else positions
        # the causal constraint is vacuous for a single new token (it may see every cached key)
        is_causal = T > 1 or caches is None
        aux = x.new_zeros(())
        for i, block in enumerate(self.blocks):
            kwargs = dict(
                mask=mask,
                is_causal=is_causal,
                positions=attn_positions,
                cache=None if caches is None else caches[i],
                need_weights=need_weights,
            )
            if c.activation_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False, **kwargs)
            else:
                x = block(x, **kwargs)
            if isinstance(block.ffn, MoE):
                aux = aux + block.ffn.aux_loss
        self.aux_loss = aux
        if logits_to_keep is not None:
            x = x[:, -logits_to_keep:]  # (B, logits_to_keep, C)
        return self.lm_head(self.norm_f(x))  # (B, T, V)

    def num_parameters(self, *, exclude_embeddings: bool = False) -> int:
        """Number of distinct parameters (tied weights counted once)."""
        seen = {id(p): p for p in self.parameters()}
        n = sum(p.numel() for p in seen.values())
        if exclude_embeddings:
            n -= self.tok_emb.weight.numel()
            if self.config.position == "learned":
                n -= self.pos_emb.weight.numel()
        return n


def _load_tokenizer(run_dir):
    from attnlab.data.tokenizers import TOKENIZER_FILE, load_tokenizer

    # a run converted from a checkpoint without tokenizer.json still loads (tokenizer None)
    if not (run_dir / TOKENIZER_FILE).exists():
        return None
    return load_tokenizer(run_dir)


register_kind(DecoderLM.kind, lambda d: DecoderLM(ModelConfig.from_dict(d)), _load_tokenizer)
