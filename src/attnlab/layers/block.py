"""The Transformer block: attention and FFN sub-layers with residuals, pre- or post-norm.

    post-norm (Vaswani 2017):  x = Norm(x + Sublayer(x))
    pre-norm  (GPT-2 onward):  x = x + Sublayer(Norm(x))
    without residuals (an ablation, ``residual=False``): Norm(Sublayer(x)), Sublayer(Norm(x))

One block serves encoders (self-attention), decoders (causal self-attention, optional
cross-attention to an encoder's output) and vision models (Swin wraps it in window partitioning);
the model wrappers add embeddings, masks and heads. Parts a block lacks (cross-attention,
drop-path) are ``nn.Identity`` placeholders, so ``forward`` has no branches on them.

The block takes ready parts; :func:`attnlab.layers.builders.build_block` builds them from the fields
of a :class:`attnlab.config.BlockConfig`.

Shape legend: B batch, T time, S context length, C d_model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from attnlab.attention.cache import KVCache
from attnlab.attention.multihead import MultiHeadAttention
from attnlab.layers.drop_path import DropPath
from attnlab.layers.hook import HookPoint
from attnlab.layers.position import Positions

__all__ = ["TransformerBlock", "run_blocks", "NormPosition"]

NormPosition = Literal["pre", "post"]


class TransformerBlock(nn.Module):
    """Self-attention, optional cross-attention, and a feed-forward sub-layer.

    Args:
        attn: self-attention module (a :class:`MultiHeadAttention`).
        ffn: position-wise FFN (``MLP``, ``SwiGLU`` or ``MoE``), or None for an attention-only
            block (no FFN sub-layer: ``ffn`` and ``norm2`` are ``nn.Identity``).
        norm1, norm2: norms around the attention and FFN sub-layers.
        cross_attn, norm_cross: cross-attention and its norm (decoders of encoder–decoders).
        norm_position: ``pre`` or ``post``.
        residual: add each sub-layer's input back (False: the skip connections removed,
            ``x ← F(Norm(x))`` pre-norm, ``x ← Norm(F(x))`` post-norm; an ablation).
        dropout: residual dropout on each sub-layer's output.
        drop_path: stochastic depth: drop each residual branch for whole samples with this rate.
    """

    def __init__(
        self,
        attn: MultiHeadAttention,
        ffn: nn.Module | None,
        norm1: nn.Module,
        norm2: nn.Module,
        *,
        cross_attn: MultiHeadAttention | None = None,
        norm_cross: nn.Module | None = None,
        norm_position: str = "pre",
        residual: bool = True,
        dropout: float = 0.0,
        drop_path: float = 0.0,
    ) -> None:
        super().__init__()
        if norm_position not in ("pre", "post"):
            raise ValueError(f"norm_position must be 'pre' or 'post', got {norm_position!r}")
        if (cross_attn is None) != (norm_cross is None):
            raise ValueError("cross_attn and norm_cross go together")
        self.has_ffn = ffn is not None
        if not self.has_ffn:
            ffn = norm2 = nn.Identity()
        self.attn, self.ffn, self.norm1, self.norm2 = attn, ffn, norm1, norm2
        self.has_cross = cross_attn is not None
        self.cross_attn = cross_attn if cross_attn is not None else nn.Identity()
        self.norm_cross = norm_cross if norm_cross is not None else nn.Identity()
        self.norm_position, self.residual = norm_position, residual
        self.dropout = nn.Dropout(dropout)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        # hook points (attnlab.layers.hook), all (B, T, C): the residual stream and what each
        # sub-layer adds to it
        self.hook_resid_pre, self.hook_resid_mid = HookPoint(), HookPoint()
        self.hook_attn_out, self.hook_mlp_out, self.hook_resid_post = (
            HookPoint(),
            HookPoint(),
            HookPoint(),
        )
        if self.has_cross:
            self.hook_cross_attn_out, self.hook_resid_cross = HookPoint(), HookPoint()

    def _residual(self, x: Tensor, norm: nn.Module, sublayer) -> Tensor:
        if not self.residual:  # the ablation: no skip connection
            out = self.drop_path(
                self.dropout(sublayer(norm(x) if self.norm_position == "pre" else x))
            )
            return out if self.norm_position == "pre" else norm(out)
        if self.norm_position == "pre":
            return x + self.drop_path(self.dropout(sublayer(norm(x))))
        return norm(x + self.drop_path(self.dropout(sublayer(x))))

    def forward(
        self,
        x: Tensor,
        *,
        mask: Tensor | None = None,
        is_causal: bool = False,
        positions: Tensor | None = None,
        attn_bias: Tensor | None = None,
        cache: KVCache | None = None,
        context: Tensor | None = None,
        context_mask: Tensor | None = None,
        cross_cache: KVCache | None = None,
        pos_emb: Positions | None = None,
        value_embed: Tensor | None = None,
    ) -> Tensor:
        """``x (B, T, C) -> (B, T, C)``.

        Args:
            mask: self-attention mask broadcastable to ``(B, H, T, T_total)``; True = may attend.
            is_causal: causal self-attention.
            positions: query positions for RoPE/ALiBi.
            attn_bias: additive self-attention scores broadcastable to ``(B, H, T, T_total)``
                (Swin's relative table, T5's bias computed once for all layers).
            cache: self-attention KV cache.
            context: encoder output ``(B, S, C_ctx)`` for cross-attention.
            context_mask: cross-attention mask broadcastable to ``(B, H, T, S)``.
            cross_cache: cache of the context's keys/values.
            pos_emb: the model's shared relative position module (RoPE, ALiBi, T5), applied in
                self-attention.
            value_embed: ``(B, T, Hkv·D)`` added to the self-attention's values (the LM's value
                embeddings; see :class:`~attnlab.attention.MultiHeadAttention`).

        Attention weights are not kept: read them with :func:`attnlab.attention.capture_attention`.
        """

        def self_attention(h: Tensor) -> Tensor:
            kw = {"positions": positions, "bias": attn_bias, "cache": cache, "pos_emb": pos_emb}
            if value_embed is not None:  # (only then: other attention classes lack the argument)
                kw["value_embed"] = value_embed
            return self.hook_attn_out(self.attn(h, mask=mask, is_causal=is_causal, **kw)[0])

        x = self.hook_resid_pre(x)
        x = self.hook_resid_mid(self._residual(x, self.norm1, self_attention))
        if self.has_cross:
            if context is None and (cross_cache is None or cross_cache.length == 0):
                raise ValueError("this block has cross-attention: pass context=(B, S, C)")

            def cross_attention(h: Tensor) -> Tensor:
                out, _ = self.cross_attn(h, context, mask=context_mask, cache=cross_cache)
                return self.hook_cross_attn_out(out)

            x = self.hook_resid_cross(self._residual(x, self.norm_cross, cross_attention))
        if not self.has_ffn:  # an attention-only block (ffn="none")
            return self.hook_resid_post(x)
        ffn = lambda h: self.hook_mlp_out(self.ffn(h))  # noqa: E731
        return self.hook_resid_post(self._residual(x, self.norm2, ffn))


def run_blocks(
    blocks: Sequence[nn.Module],
    x: Tensor,
    *,
    caches: Sequence[KVCache] | None = None,
    cross_caches: Sequence[KVCache] | None = None,
    checkpointing: bool = False,
    **kwargs: Any,
) -> Tensor:
    """Run ``x (B, T, C)`` through a stack of blocks, block ``i`` reading ``caches[i]`` and
    ``cross_caches[i]`` (incremental decoding) and every block the same ``kwargs`` (masks,
    positions, the encoder's ``context``).

    With ``checkpointing``, a training forward pass keeps only each block's input and recomputes
    the block in the backward pass (activation checkpointing: less memory, about a third more
    compute); evaluation and no-grad passes run normally.
    """
    recompute = checkpointing and torch.is_grad_enabled() and any(b.training for b in blocks)
    for i, block in enumerate(blocks):
        if caches is not None:
            kwargs["cache"] = caches[i]
        if cross_caches is not None:
            kwargs["cross_cache"] = cross_caches[i]
        if recompute:
            x = checkpoint(block, x, use_reentrant=False, **kwargs)
        else:
            x = block(x, **kwargs)
    return x
