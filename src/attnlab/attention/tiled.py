"""Exact attention without the N×N matrix: tiling, online softmax and a recomputing backward.

FlashAttention's idea in pure PyTorch. The queries are cut into blocks of ``block_q`` rows and the
keys into blocks of ``block_k`` columns. For one query block the key blocks are visited in turn and
three running quantities are kept per query row i:

    m_i   = max_j s_ij                       (running maximum of the scores seen so far)
    l_i   = Σ_j exp(s_ij − m_i)              (running softmax normaliser)
    acc_i = Σ_j exp(s_ij − m_i) v_j          (running un-normalised output)

When a new key block raises the maximum from m to m', the old sums are rescaled by exp(m − m')
(the *online softmax*), so the result ``out_i = acc_i / l_i`` is exactly softmax(s_i) V. Only a
``(block_q, block_k)`` tile of scores exists at any time; memory is O(N·d) instead of O(N²).

The backward pass does not store the probabilities either: it keeps the per-row log-sum-exp
``lse_i = m_i + log l_i`` and recomputes each tile's probabilities ``P = exp(S − lse)``, then

    dV = Pᵀ dO,   dP = dO Vᵀ,   dS = P ∘ (dP − rowsum(dO ∘ O)),
    dQ = dS K · scale,   dK = dSᵀ Q · scale.

Under ``is_causal`` the tiles entirely above the (bottom-right aligned) diagonal are skipped.
Grouped-query attention never repeats K/V: the g = H/Hkv query heads that share one K/V head are
folded into the rows of one matmul. Rows with no allowed key give zeros.

Shape legend: B batch, H query heads, Hkv key/value heads, g = H/Hkv, Tq queries, Tk keys,
D key width, Dv value width, R = rows of a query tile (block_q · g), C = columns of a key tile.

Options (``scaled_dot_product_attention(..., backend="tiled", block_q=..., block_k=...)``):
``block_q`` (default 128) and ``block_k`` (default 256), positive integers.

The block-sparse backend (:mod:`attnlab.attention.sparse`) runs the same loops over a given set of
live tiles only; :func:`count_tiles` records which tiles either backend actually computes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from attnlab.attention.core import register_backend

__all__ = ["tiled_attention", "count_tiles", "TileCount", "DEFAULT_BLOCK_Q", "DEFAULT_BLOCK_K"]

# Tiles large enough to amortise per-tile Python overhead, small enough that few causal tiles
# straddle the diagonal; measured on CPU fp32, d=64 (128×256 fp32 scores × 8 heads = 1 MiB).
DEFAULT_BLOCK_Q = 128
DEFAULT_BLOCK_K = 256


@dataclass
class TileCount:
    """The (query-block, key-block) tiles whose scores were computed, in call order."""

    forward: list[tuple[int, int]] = field(default_factory=list)
    backward: list[tuple[int, int]] = field(default_factory=list)


_COUNTERS: list[TileCount] = []


@contextmanager
def count_tiles() -> Iterator[TileCount]:
    """Record every score tile the ``tiled`` and ``block_sparse`` backends compute.

    ``with count_tiles() as n: ...`` then ``n.forward`` / ``n.backward`` list the
    ``(query block, key block)`` index of each tile computed, in the forward and backward passes.
    Nothing is recorded (and nothing is kept) outside the ``with`` block.
    """
    counter = TileCount()
    _COUNTERS.append(counter)
    try:
        yield counter
    finally:
        _COUNTERS.remove(counter)


def _note(kind: str, qb: int, kb: int) -> None:
    for counter in _COUNTERS:
        getattr(counter, kind).append((qb, kb))


def positive_int_option(backend: str, name: str, value: Any) -> int:
    """Validate a backend option that must be a positive integer (bools rejected)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"backend {backend!r}: option {name} must be a positive integer, got {value!r}"
        )
    return value


def _to_heads(t: Tensor | None, n_heads: int, n_kv: int) -> Tensor | None:
    """A mask/bias broadcastable to (B, H, Tq, Tk) -> (B|1, Hkv|1, Tq|1, g|1, Tk|1).

    Dimensions of size 1 stay size 1 (no expansion), so a (B, 1, 1, Tk) padding mask stays small.
    """
    if t is None:
        return None
    while t.dim() < 4:
        t = t.unsqueeze(0)
    g = n_heads // n_kv
    b, h, tq, tk = t.shape
    if h == 1:
        return t.view(b, 1, tq, 1, tk)
    return t.view(b, n_kv, g, tq, tk).transpose(2, 3)  # (B, Hkv, Tq, g, Tk)


def _tile(t: Tensor | None, q0: int, q1: int, k0: int, k1: int) -> Tensor | None:
    """Cut the (q0:q1, k0:k1) tile out of a (.., Tq|1, g|1, Tk|1) mask or bias."""
    if t is None:
        return None
    if t.shape[-3] != 1:
        t = t[..., q0:q1, :, :]
    if t.shape[-1] != 1:
        t = t[..., k0:k1]
    return t


def _causal_tile(q0: int, q1: int, k0: int, k1: int, offset: int, device) -> Tensor:
    """Boolean (bq, 1, bk) tile of the bottom-right aligned causal mask: key j ≤ query i+offset."""
    qi = torch.arange(q0, q1, device=device)[:, None, None]
    kj = torch.arange(k0, k1, device=device)[None, None, :]
    return kj <= qi + offset


class _TiledAttention(torch.autograd.Function):
    """Autograd function on canonical shapes: q (B, Hkv, Tq·g, D) with rows ordered (t, head-in-
    group), k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv); mask/bias (B|1, Hkv|1, Tq|1, g|1, Tk|1).
    ``live``: None (every tile) or, per query block, the sorted key blocks to compute."""

    @staticmethod
    def forward(ctx, q, k, v, bias, mask, g, is_causal, scale, block_q, block_k, live=None):
        B, Hkv, rows, D = q.shape
        Tq, Tk, Dv = rows // g, k.shape[-2], v.shape[-1]
        offset = Tk - Tq
        qs = q * scale
        out = q.new_empty(B, Hkv, rows, Dv)
        lse = q.new_empty(B, Hkv, rows, dtype=_stats_dtype(q))
        with torch.autocast(q.device.type, enabled=False):  # precision is chosen explicitly
            for q0 in range(0, Tq, block_q):
                q1 = min(q0 + block_q, Tq)
                qi = qs[:, :, q0 * g : q1 * g]  # (B, Hkv, R, D)
                k_blocks = None if live is None else live[q0 // block_q]
                o_blk, lse_blk = _forward_rows(
                    qi,
                    k,
                    v,
                    bias,
                    mask,
                    g,
                    q0,
                    q1,
                    offset,
                    is_causal,
                    block_k,
                    k_blocks,
                    q0 // block_q,
                )
                out[:, :, q0 * g : q1 * g] = o_blk
                lse[:, :, q0 * g : q1 * g] = lse_blk
        ctx.save_for_backward(q, k, v, out, lse, bias, mask)
        ctx.cfg = (g, is_causal, scale, block_q, block_k, live)
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse, bias, mask = ctx.saved_tensors
        g, is_causal, scale, block_q, block_k, live = ctx.cfg
        need_bias = bias is not None and ctx.needs_input_grad[3]
        with torch.autocast(q.device.type, enabled=False):
            grads = _backward(
                q,
                k,
                v,
                out,
                lse,
                bias,
                mask,
                d_out.to(q.dtype).contiguous(),
                g,
                is_causal,
                scale,
                block_q,
                block_k,
                need_bias,
                live,
            )
        return (*grads, None, None, None, None, None, None, None)


def _stats_dtype(q: Tensor) -> torch.dtype:
    """Softmax statistics and accumulators: at least fp32 even for bf16/fp16 inputs."""
    return torch.promote_types(q.dtype, torch.float32)


def _backward(
    q, k, v, out, lse, bias, mask, d_out, g, is_causal, scale, block_q, block_k, need_bias, live
):
    """Gradients of q, k, v (and bias) by recomputing each tile's probabilities from ``lse``."""
    B, Hkv, rows, D = q.shape
    Tq, Tk = rows // g, k.shape[-2]
    offset = Tk - Tq
    cdt, adt = q.dtype, _stats_dtype(q)  # matmul dtype, accumulation dtype
    qs = q * scale
    # (B, Hkv, rows): rowsum(dO ∘ O) = Σ_j P_ij dP_ij
    delta = (d_out.to(adt) * out.to(adt)).sum(-1)
    dq = torch.zeros(q.shape, dtype=adt, device=q.device)
    dk = torch.zeros(k.shape, dtype=adt, device=q.device)
    dv = torch.zeros(v.shape, dtype=adt, device=q.device)
    dbias = torch.zeros(bias.shape, dtype=adt, device=q.device) if need_bias else None
    live_sets = None if live is None else [set(row) for row in live]
    for k0 in range(0, Tk, block_k):
        k1 = min(k0 + block_k, Tk)
        kj, vj = k[:, :, k0:k1], v[:, :, k0:k1]  # (B, Hkv, C, D|Dv)
        # causal: query rows before first_q see none of these keys
        first_q = max(0, k0 - offset) if is_causal else 0
        for q0 in range(first_q - first_q % block_q, Tq, block_q):
            if live_sets is not None and k0 // block_k not in live_sets[q0 // block_q]:
                continue  # a fully masked tile: its probabilities are all zero
            q1 = min(q0 + block_q, Tq)
            r0, r1 = q0 * g, q1 * g
            if _COUNTERS:
                _note("backward", q0 // block_q, k0 // block_k)
            s = (qs[:, :, r0:r1] @ kj.transpose(-2, -1)).to(adt)  # (B, Hkv, R, C)
            allowed = _tile_allowed(mask, q0, q1, k0, k1, offset, is_causal, q.device)
            s = _add_bias(s, bias, q0, q1, k0, k1, g)
            s = s.sub_(lse[:, :, r0:r1, None])
            if allowed is not None:
                s = s.view(B, Hkv, q1 - q0, g, k1 - k0).masked_fill_(~allowed, float("-inf"))
                s = s.view(B, Hkv, r1 - r0, k1 - k0)
            p = s.exp_()  # (B, Hkv, R, C) probabilities, recomputed
            do = d_out[:, :, r0:r1]  # (B, Hkv, R, Dv)
            # sums over the g heads of the group too
            dv[:, :, k0:k1] += p.to(cdt).transpose(-2, -1) @ do
            dp = (do @ vj.transpose(-2, -1)).to(adt)  # (B, Hkv, R, C)
            ds = dp.sub_(delta[:, :, r0:r1, None]).mul_(p)  # dL/dS (before scale)
            if need_bias:
                _accumulate_bias_grad(dbias, ds, q0, q1, k0, k1, g)
            ds = ds.to(cdt)
            dq[:, :, r0:r1] += ds @ kj
            dk[:, :, k0:k1] += ds.transpose(-2, -1) @ qs[:, :, r0:r1]
    dq = dq.mul_(scale).to(q.dtype)
    dbias = None if dbias is None else dbias.to(bias.dtype)
    return dq, dk.to(k.dtype), dv.to(v.dtype), dbias


def _tile_allowed(mask, q0, q1, k0, k1, offset, is_causal, device) -> Tensor | None:
    """The tile's boolean allowed-mask (broadcastable to (B, Hkv, bq, g, bk)), or None if all."""
    allowed = _tile(mask, q0, q1, k0, k1)
    if is_causal and k1 - 1 > q0 + offset:  # the tile crosses the diagonal
        c = _causal_tile(q0, q1, k0, k1, offset, device)
        allowed = c if allowed is None else allowed & c
    return allowed


def _add_bias(s: Tensor, bias, q0, q1, k0, k1, g) -> Tensor:
    if bias is None:
        return s
    B, Hkv, R, C = s.shape
    return (s.view(B, Hkv, q1 - q0, g, C) + _tile(bias, q0, q1, k0, k1)).view(B, Hkv, R, C)


def _accumulate_bias_grad(dbias: Tensor, ds: Tensor, q0, q1, k0, k1, g) -> None:
    """Add the tile's dL/dS to dbias, summed over the dimensions the bias broadcasts along."""
    B, Hkv, R, C = ds.shape
    ds = ds.view(B, Hkv, q1 - q0, g, C)
    target = _tile(dbias, q0, q1, k0, k1)
    dims = [i for i in range(5) if target.shape[i] == 1 and ds.shape[i] != 1]
    target += ds.sum(dim=dims, keepdim=True) if dims else ds


def _forward_rows(qi, k, v, bias, mask, g, q0, q1, offset, is_causal, block_k, k_blocks=None, qb=0):
    """Online softmax of one query tile against its key tiles -> (out (B,Hkv,R,Dv), lse).

    ``k_blocks``: the key blocks to visit (default: every block the causal mask leaves);
    ``qb``: this query block's index (for :func:`count_tiles`)."""
    B, Hkv, R, _ = qi.shape
    Tk, Dv = k.shape[-2], v.shape[-1]
    last_k = min(Tk, q1 - 1 + offset + 1) if is_causal else Tk  # keys after this are never seen
    cdt, adt = qi.dtype, _stats_dtype(qi)
    acc = qi.new_zeros(B, Hkv, R, Dv, dtype=adt)
    m = qi.new_full((B, Hkv, R), float("-inf"), dtype=adt)
    l = qi.new_zeros(B, Hkv, R, dtype=adt)
    starts = range(0, max(last_k, 0), block_k)
    if k_blocks is not None:
        starts = [kb * block_k for kb in k_blocks if kb * block_k < last_k]
    for k0 in starts:
        k1 = min(k0 + block_k, Tk)
        if _COUNTERS:
            _note("forward", qb, k0 // block_k)
        s = (qi @ k[:, :, k0:k1].transpose(-2, -1)).to(adt)  # (B, Hkv, R, C)
        s = _add_bias(s, bias, q0, q1, k0, k1, g)
        allowed = _tile_allowed(mask, q0, q1, k0, k1, offset, is_causal, qi.device)
        if allowed is not None:
            s = s.view(B, Hkv, q1 - q0, g, k1 - k0).masked_fill_(~allowed, float("-inf"))
            s = s.view(B, Hkv, R, k1 - k0)
        m_new = torch.maximum(m, s.amax(dim=-1))
        # a row with nothing allowed yet has m = -inf: subtract 0 instead so exp gives 0, not NaN
        m_safe = m_new.masked_fill(m_new == float("-inf"), 0.0)
        p = s.sub_(m_safe[..., None]).exp_()  # (B, Hkv, R, C)
        alpha = (m - m_safe).exp_()  # rescales what was accumulated under the old maximum
        l = l.mul_(alpha).add_(p.sum(dim=-1))
        acc = acc.mul_(alpha[..., None]).add_(p.to(cdt) @ v[:, :, k0:k1])
        m = m_new
    empty = l == 0
    out = acc.div_(l.masked_fill(empty, 1.0)[..., None])
    # lse = +inf on empty rows makes the recomputed P = exp(s - lse) exactly 0 in the backward
    lse = m.add_(l.log()).masked_fill_(empty, float("inf"))
    return out, lse


def tiled_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    is_causal: bool = False,
    scale: float,
    dropout_p: float = 0.0,
    return_weights: bool = False,
    block_q: int = DEFAULT_BLOCK_Q,
    block_k: int = DEFAULT_BLOCK_K,
) -> tuple[Tensor, None]:
    """Exact softmax attention computed tile by tile (the ``tiled`` backend).

    Args:
        q: ``(..., H, Tq, D)`` (or ``(Tq, D)``).
        k, v: ``(..., Hkv, Tk, D|Dv)`` with ``H % Hkv == 0``.
        mask: boolean, broadcastable to ``(..., H, Tq, Tk)``; True = may attend.
        bias: additive float scores broadcastable like ``mask``; gets a gradient if it needs one.
        is_causal: bottom-right aligned causal mask; tiles above the diagonal are skipped.
        scale: score scale (``1/√D`` from the caller).
        dropout_p: must be 0 (dropout on the weights is not implemented for this backend).
        return_weights: must be False (the weights are never materialised).
        block_q, block_k: tile sizes (positive ints).

    Returns:
        ``(out (..., H, Tq, Dv), None)``.

    Raises:
        ValueError: a bad block size (dropout and a request for the weights are refused by
            :func:`~attnlab.attention.scaled_dot_product_attention`, which knows the backend's
            registration).
    """
    block_q = positive_int_option("tiled", "block_q", block_q)
    block_k = positive_int_option("tiled", "block_k", block_k)
    return tiled_forward(q, k, v, mask, bias, is_causal, scale, block_q, block_k), None


def tiled_forward(q, k, v, mask, bias, is_causal, scale, block_q, block_k, live=None) -> Tensor:
    """The tiled computation on validated inputs (shared with the block-sparse backend).

    ``live``: None (every tile the causal mask leaves) or, for each query block of ``block_q``
    rows, the sorted indices of the key blocks of ``block_k`` columns to compute; tiles left out
    are treated as fully masked. Returns ``out (..., H, Tq, Dv)``.
    """
    lead = q.shape[:-3] if q.dim() >= 3 else ()
    Tq, D, Tk, Dv = q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
    H = q.shape[-3] if q.dim() >= 3 else 1
    Hkv = k.shape[-3] if k.dim() >= 3 else 1
    g = H // Hkv
    q4 = q.reshape(-1, H, Tq, D)  # (B, H, Tq, D)
    k4 = k.reshape(-1, Hkv, Tk, D).contiguous()  # (B, Hkv, Tk, D)
    v4 = v.reshape(-1, Hkv, Tk, Dv).contiguous()  # (B, Hkv, Tk, Dv)
    B = q4.shape[0]
    # fold the g query heads of a group into rows ordered (t, head-in-group)
    qr = q4.view(B, Hkv, g, Tq, D).transpose(2, 3).reshape(B, Hkv, Tq * g, D)  # (B, Hkv, Tq·g, D)
    mask5 = _to_heads(_flatten_lead(mask, lead), H, Hkv)
    bias5 = _to_heads(_flatten_lead(bias, lead), H, Hkv)
    out = _TiledAttention.apply(
        qr, k4, v4, bias5, mask5, g, is_causal, scale, block_q, block_k, live
    )
    out = out.view(B, Hkv, Tq, g, Dv).transpose(2, 3).reshape(B, H, Tq, Dv)  # (B, H, Tq, Dv)
    return out.reshape(*lead, *q.shape[-3:-1], Dv) if q.dim() >= 3 else out.view(Tq, Dv)


def _flatten_lead(t: Tensor | None, lead: torch.Size | tuple) -> Tensor | None:
    """Give a mask/bias exactly one leading (batch) dim before its (H, Tq, Tk) dims."""
    if t is None:
        return None
    while t.dim() < len(lead) + 3:
        t = t.unsqueeze(0)
    if len(lead) == 0:
        return t.unsqueeze(0)
    if len(lead) == 1:
        return t
    t_lead = t.shape[: len(lead)]
    if all(s == 1 for s in t_lead):
        return t.reshape(1, *t.shape[len(lead) :])
    return t.expand(*lead, *t.shape[len(lead) :]).reshape(-1, *t.shape[len(lead) :])


register_backend("tiled", tiled_attention, dropout=False)
