"""Convenience builders that take a block's fields as keywords (strings for the choices):
a :class:`attnlab.config.BlockConfig` is made from them, and the builders of
:mod:`attnlab.layers.builders` build the modules from it.

    mha = multi_head_attention(512, 8, n_kv_heads=2, position="rope", qk_norm="rmsnorm")
    block = transformer_block(64, 4, ffn="swiglu", norm="rmsnorm")
"""

from __future__ import annotations

from typing import Any

from attnlab.attention.multihead import MultiHeadAttention
from attnlab.config.base import BlockConfig
from attnlab.layers.block import TransformerBlock
from attnlab.layers.builders import build_attention, build_block

__all__ = ["multi_head_attention", "transformer_block"]

_ATTENTION_POSITIONS = ("none", "rope", "alibi", "t5")


def multi_head_attention(
    d_model: int,
    n_heads: int,
    *,
    cross: bool = False,
    context_dim: int | None = None,
    max_seq_len: int | None = None,
    position: str = "none",
    **fields: Any,
) -> MultiHeadAttention:
    """A :class:`MultiHeadAttention` from block fields given as keywords.

    Args:
        d_model, n_heads: C and H.
        cross, context_dim: cross-attention to a context of this width (default ``d_model``).
        max_seq_len: the sequence length N (Linformer's ``linformer_k`` needs it).
        position: ``none`` | ``rope`` | ``alibi`` | ``t5`` (the layer's own module; absolute
            positions belong to a model's embeddings).
        **fields: any other :class:`attnlab.config.BlockConfig` field (``n_kv_heads``,
            ``head_dim``, ``bias``, ``qk_norm``, ``attn_dropout``, ``rope_theta``, ``backend``,
            ``backend_options``, ``linformer_k``...).

    Raises:
        ValueError: an unknown field or value, widths that do not fit.
    """
    if position not in _ATTENTION_POSITIONS:
        raise ValueError(
            f"attention positions are {list(_ATTENTION_POSITIONS)}, got {position!r} (absolute "
            "positions are added to a model's embeddings)"
        )
    config = BlockConfig(d_model=d_model, n_heads=n_heads, position=position, **fields)
    return build_attention(config, cross=cross, context_dim=context_dim, max_seq_len=max_seq_len)


def transformer_block(
    d_model: int,
    n_heads: int,
    *,
    cross_attention: bool = False,
    context_dim: int | None = None,
    max_seq_len: int | None = None,
    position: str = "none",
    **fields: Any,
) -> TransformerBlock:
    """A :class:`TransformerBlock` from block fields given as keywords (as
    :func:`multi_head_attention`; ``cross_attention`` adds cross-attention to a context of width
    ``context_dim``).

    Raises:
        ValueError: an unknown field or value.
    """
    if position not in _ATTENTION_POSITIONS:
        raise ValueError(
            f"a block's own positions are {list(_ATTENTION_POSITIONS)}, got {position!r}"
        )
    config = BlockConfig(d_model=d_model, n_heads=n_heads, position=position, **fields)
    return build_block(
        config, cross_attention=cross_attention, context_dim=context_dim, max_seq_len=max_seq_len
    )
