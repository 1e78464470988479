"""A query or a few attending on a CPU through fp32 products: the ``decode`` attention backend.

A decoding step has one query per head. On a CPU torch's fused kernel converts every block of
bf16/fp16 keys on machines without bf16 instructions, and costs about 50 µs a call even where
it has them, so two matrix products in fp32 are faster (a 2-core AVX2 machine: 0.66 → 0.37 ms
over 1,024 keys, 3.7 → 0.9 ms over 4,096, six heads of 64; an AVX-512 BF16 one: 50 → 32 µs
over 110 keys, 670 → 180 µs over 1,024); inside ``torch.compile`` inductor fuses the products,
the mask and the softmax, so there the explicit form is always the faster. The ``decode``
backend takes fp32 products for such a query (exact up to rounding, which fp32 makes smaller)
and is ``sdpa`` otherwise:

- one bf16/fp16 query with no mask (a step over a growing KV cache, in eager mode):
  :func:`one_query_fp32`, the two products alone;
- one query or a few (up to :data:`FP32_QUERIES`) with a mask, over ``ONE_QUERY_FP32_FROM``
  keys or more, or inside ``torch.compile``: the math path in fp32;
- a few causal queries over a growing cache (a speculative verification of k + 1 tokens in
  eager mode) inside :func:`rows_as_steps`: each query attends on its own over exactly the
  keys its one-token step saw, so it rounds as that step does. Over the whole window, the later
  keys masked, torch's kernels sum over a longer row, and a greedy run with bf16 activations
  flipped a near-tie of two logits; greedy speculative decoding asks for the split and then
  gives plain greedy decoding's tokens. It costs a call per query (eager greedy speculation on
  a 4 × 256 int8 target: 1.2× plain at K = 4 instead of 1.6×), so sampling, which needs no
  bit-for-bit rows, keeps the whole-window attention.

:func:`decode_attention` (applied by :func:`attnlab.fast.for_decoding`) selects the backend in
every attention layer that uses the default one.

Shape legend: B batch, H heads, Hkv key/value heads, Tq queries, Tk keys, D head width.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.attention.core import math_attention, register_backend, sdpa_attention

__all__ = [
    "FP32_QUERIES",
    "ONE_QUERY_FP32_FROM",
    "one_query_in_fp32",
    "one_query_fp32",
    "rows_as_steps",
    "decode_attention",
]

#: from this many keys on, a masked bf16/fp16 query (or a few) attends faster through fp32
#: products on a CPU
ONE_QUERY_FP32_FROM = 512
#: the most queries that take a query's path: a speculative verification of k + 1 tokens
FP32_QUERIES = 32
_HALF = (torch.bfloat16, torch.float16)
_split = threading.local()  # .on: inside rows_as_steps() (per thread)


@contextmanager
def rows_as_steps() -> Iterator[None]:
    """Inside, the ``decode`` backend attends each query of a speculative verification over a
    growing KV cache (eager mode, a CPU) over exactly the keys its one-token step saw, so that
    every row of the verification's logits is that step's bit for bit (greedy speculative
    decoding enters it; see the module docstring for what it costs)."""
    before = getattr(_split, "on", False)
    _split.on = True
    try:
        yield
    finally:
        _split.on = before


def one_query_in_fp32(q: Tensor, k: Tensor, dropout_p: float) -> bool:
    """Whether a single query ``(B, H, 1, D)`` on a CPU (or up to :data:`FP32_QUERIES`, a
    verification's) attends as fp32 products rather than through torch's fused kernel: always
    inside ``torch.compile``; in eager mode for bf16/fp16 over ``ONE_QUERY_FP32_FROM`` keys or
    more; never with dropout (training). (In eager mode one unmasked bf16/fp16 query takes
    :func:`one_query_fp32` before this is asked.)"""
    few = 1 <= q.shape[-2] <= FP32_QUERIES
    if not few or q.device.type != "cpu" or dropout_p > 0 or not q.is_floating_point():
        return False
    if torch.compiler.is_compiling():
        return True
    return q.dtype in _HALF and k.shape[-2] >= ONE_QUERY_FP32_FROM


def one_query_fp32(
    q: Tensor, k: Tensor, v: Tensor, *, scale: float, bias: Tensor | None = None
) -> Tensor:
    """``softmax(q kᵀ · scale + bias) v`` for one query ``q (B, H, 1, D)`` over every key of
    ``k, v (B, Hkv, Tk, D)`` (no mask), in fp32, returned in ``q``'s dtype. The ``H / Hkv``
    heads that share a key/value head are the rows of one product (GQA without copying keys);
    ``bias`` broadcasts to ``(B, H, 1, Tk)``. Keys and values already in fp32 are used as they
    are (a verification converts its window once for all its queries)."""
    B, H, _, D = q.shape
    Hkv, Tk = k.shape[-3], k.shape[-2]
    g = H // Hkv
    scores = torch.matmul((q.float() * scale).reshape(B, Hkv, g, D), k.float().transpose(-2, -1))
    if bias is not None:  # (..., H or 1, 1, Tk) -> (..., Hkv, g, Tk)
        lead = bias.shape[:-3]
        scores = scores + bias.float().expand(*lead, H, 1, Tk).reshape(*lead, Hkv, g, Tk)
    out = torch.matmul(scores.softmax(dim=-1), v.float())  # (B, Hkv, g, D)
    return out.reshape(B, H, 1, D).to(q.dtype)


def _eager_cpu(q: Tensor, args: dict[str, Any]) -> bool:
    """An unmasked (B, H, Tq, D) attention without dropout, on a CPU, outside torch.compile."""
    return (
        not torch.compiler.is_compiling()
        and q.dim() == 4
        and q.device.type == "cpu"
        and args["mask"] is None
        and args["dropout_p"] == 0
    )


def _decode_backend(q: Tensor, k: Tensor, v: Tensor, **args: Any) -> tuple[Tensor, Tensor | None]:
    # args: the common arguments of every backend (mask, bias, is_causal, scale, dropout_p,
    # return_weights; see attnlab.attention.core.register_backend)
    if args["return_weights"]:
        return math_attention(q, k, v, **args)
    n_q, n_k = q.shape[-2], k.shape[-2]
    verification = 1 < n_q <= FP32_QUERIES and n_k > n_q and args["is_causal"]
    if verification and _eager_cpu(q, args) and getattr(_split, "on", False):
        # a verification: query i of the newest n_q sees keys [0, n_k - n_q + i]; attend over
        # exactly those, as the one-token step at its position did (a bias row cut to them)
        bias, outs = args["bias"], []
        if q.dtype in _HALF:  # one_query_fp32 for every query: convert the window once
            k, v = k.float(), v.float()
        for i in range(n_q):
            seen = n_k - n_q + 1 + i
            row = None if bias is None else bias[..., min(i, bias.shape[-2] - 1), None, :seen]
            one = {**args, "is_causal": False, "bias": row}
            outs.append(
                _decode_backend(q[..., i : i + 1, :], k[..., :seen, :], v[..., :seen, :], **one)[0]
            )
        return torch.cat(outs, dim=-2), None
    if n_q == 1 and q.dtype in _HALF and _eager_cpu(q, args):
        return one_query_fp32(q, k, v, scale=args["scale"], bias=args["bias"]), None
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
