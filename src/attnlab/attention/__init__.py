"""Attention: scaled dot-product (with backends), masks, additive, multi-head, KV cache."""

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
from attnlab.attention.multihead import MultiHeadAttention

__all__ = [
    "AdditiveAttention",
    "AttentionMaps",
    "capture_attention",
    "collect_aux_losses",
    "KVCache",
    "MultiHeadAttention",
    "available_backends",
    "causal_mask",
    "combine_masks",
    "key_padding_mask",
    "padding_mask",
    "register_backend",
    "repeat_kv",
    "scaled_dot_product_attention",
]
