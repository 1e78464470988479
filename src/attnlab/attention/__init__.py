"""Attention: scaled dot-product (with backends), masks, sparse patterns, Linformer, additive,
multi-head, KV cache."""

from attnlab.attention.additive import AdditiveAttention
from attnlab.attention.cache import KVCache
from attnlab.attention.capture import AttentionMaps, capture_attention, collect_aux_losses
from attnlab.attention.core import (
    available_backends,
    causal_mask,
    combine_masks,
    key_padding_mask,
    padding_mask,
    register_backend,
    repeat_kv,
    scaled_dot_product_attention,
)
from attnlab.attention.linformer import LinformerProjection
from attnlab.attention.multihead import MultiHeadAttention
from attnlab.attention.sparse import bigbird_mask, longformer_mask, pattern_mask
from attnlab.attention.tiled import count_tiles

__all__ = [
    "AdditiveAttention",
    "AttentionMaps",
    "capture_attention",
    "collect_aux_losses",
    "KVCache",
    "LinformerProjection",
    "MultiHeadAttention",
    "available_backends",
    "bigbird_mask",
    "causal_mask",
    "combine_masks",
    "count_tiles",
    "key_padding_mask",
    "longformer_mask",
    "padding_mask",
    "pattern_mask",
    "register_backend",
    "repeat_kv",
    "scaled_dot_product_attention",
]
