"""A query or a few attending on a CPU through fp32 products: the ``decode`` attention backend.

A decoding step has one query per head. On a CPU torch's fused kernel converts every block of
bf16/fp16 keys on machines without bf16 instructions, and two matrix-vector products in fp32 are
faster (measured on a 2-core AVX2 machine: 0.66 → 0.37 ms over 1,024 keys, 3.7 → 0.9 ms over
4,096, six heads of 64); inside ``torch.compile`` inductor fuses the products, the mask and the
softmax, so there the explicit form is always the faster. The ``decode`` backend takes the math
path in fp32 for such a query (exact up to rounding, which fp32 makes smaller) and is ``sdpa``
otherwise. A few queries (up to :data:`FP32_QUERIES`: a speculative verification of k + 1
tokens) take the same path, so each rounds as a one-token step does: greedy speculative decoding
then gives plain greedy decoding's tokens with bf16 activations too, where torch's fused kernel
for several queries had flipped a near-tie of two logits. :func:`decode_attention` (applied by :func:`attnlab.fast.for_decoding`) selects it in
every attention layer that uses the default backend.

Shape legend: B batch, H heads, Tq queries, Tk keys, D head width.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from attnlab.attention.core import math_attention, register_backend, sdpa_attention

__all__ = ["FP32_QUERIES", "ONE_QUERY_FP32_FROM", "one_query_in_fp32", "decode_attention"]

#: from this many keys on, one bf16/fp16 query attends faster through fp32 products on a CPU
ONE_QUERY_FP32_FROM = 512
#: a few queries (a speculative verification of k + 1 tokens) take the same path as one: each
#: query's scores, softmax and weighted sum then round as a one-token step's do, where torch's
#: fused kernel for several bf16 queries rounds otherwise (in a greedy run with bf16
#: activations, a near-tie of two logits came out the other way)
FP32_QUERIES = 32


def one_query_in_fp32(q: Tensor, k: Tensor, dropout_p: float) -> bool:
    """Whether a single query ``(B, H, 1, D)`` on a CPU (or up to :data:`FP32_QUERIES`, a
    verification's) attends as fp32 products rather than through torch's fused kernel: always
    inside ``torch.compile``; in eager mode for bf16/fp16 over ``ONE_QUERY_FP32_FROM`` keys or
    more; never with dropout (training)."""
    few = 1 <= q.shape[-2] <= FP32_QUERIES
    if not few or q.device.type != "cpu" or dropout_p > 0 or not q.is_floating_point():
        return False
    if torch.compiler.is_compiling():
        return True
    return q.dtype in (torch.bfloat16, torch.float16) and k.shape[-2] >= ONE_QUERY_FP32_FROM


def _decode_backend(q: Tensor, k: Tensor, v: Tensor, **args: Any) -> tuple[Tensor, Tensor | None]:
    # args: the common arguments of every backend (mask, bias, is_causal, scale, dropout_p,
    # return_weights; see attnlab.attention.core.register_backend)
    if args["return_weights"]:
        return math_attention(q, k, v, **args)
    if not one_query_in_fp32(q, k, args["dropout_p"]):
        return sdpa_attention(q, k, v, **args)
    bias = args["bias"]
    args = {**args, "bias": None if bias is None else bias.float()}
    out, _ = math_attention(q.float(), k.float(), v.float(), **args)
    return out.to(q.dtype), None


register_backend("decode", _decode_backend, returns_weights=True, options=())


def decode_attention(model: nn.Module) -> nn.Module:
    """Select the ``decode`` backend in every attention layer of ``model`` whose backend is
    ``auto`` or ``sdpa`` (in place; returns ``model``)."""
    for mod in model.modules():
        if getattr(mod, "backend", None) in ("auto", "sdpa") and hasattr(mod, "backend_options"):
            mod.backend = "decode"
    return model
