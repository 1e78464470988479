"""Attention that changes the operator to beat O(N²): sliding windows and linear (kernel) attention.

``window`` — local attention (Longformer, Mistral): query i sees only the ``w`` most recent keys,
itself included (causal), or the keys within distance ``w − 1`` on both sides (non-causal). Keys
farther away get exactly zero weight. It is computed *banded*: the queries are cut into chunks of
``c`` rows and each chunk is scored against the ``c + w − 1`` keys that can reach it, so time and
memory are O(N·(c + w)) instead of O(N²). With ``w ≥ N`` it is ordinary causal attention.

``linear`` — kernelised attention (Katharopoulos et al. 2020). Replace exp(q·k) by a feature dot
product φ(q)·φ(k); then by associativity

    out_i = φ(q_i)ᵀ (Σ_j φ(k_j) v_jᵀ) / φ(q_i)ᵀ (Σ_j φ(k_j))

costs O(N·F·Dv) for F features. Causal attention keeps running prefix sums of φ(k_j) v_jᵀ and
φ(k_j), computed chunk by chunk (exclusive cumulative sums between chunks, a small masked
quadratic form inside each chunk), which is exact for the chosen φ. Two feature maps:

- ``elu``: φ(x) = elu(x) + 1 (positive). A different operator from softmax, not an approximation.
- ``favor``: Performer's FAVOR+ positive random features (Choromanski et al. 2021),
  φ(x) = exp(ωᵀx − |x|²/2)/√F with orthogonal Gaussian ω, so E[φ(q)·φ(k)] = exp(q·k): an
  unbiased estimate of the softmax kernel whose error shrinks as ``n_features`` grows
  (measured in tests/test_efficient_attention.py and the benchmark).

Shape legend: B batch, H query heads, Hkv key/value heads, g = H/Hkv, Tq queries, Tk keys,
D key width, Dv value width, F features, n chunks, c chunk length, L keys per chunk (c + w − 1).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.attention.core import register_backend
from attnlab.attention.tiled import _flatten_lead, _to_heads, positive_int_option

__all__ = [
    "window_attention",
    "linear_attention",
    "elu_feature_map",
    "favor_features",
    "favor_projection",
]


def _canonical(q: Tensor, k: Tensor, v: Tensor):
    """Reshape to (B, Hkv, g, Tq, D) queries and (B, Hkv, Tk, D|Dv) keys/values."""
    H = q.shape[-3] if q.dim() >= 3 else 1
    Hkv = k.shape[-3] if k.dim() >= 3 else 1
    Tq, D, Tk, Dv = q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
    lead = q.shape[:-3] if q.dim() >= 3 else ()
    q5 = q.reshape(-1, Hkv, H // Hkv, Tq, D)  # (B, Hkv, g, Tq, D)
    k4 = k.reshape(-1, Hkv, Tk, D)  # (B, Hkv, Tk, D)
    v4 = v.reshape(-1, Hkv, Tk, Dv)  # (B, Hkv, Tk, Dv)
    return q5, k4, v4, lead, H


def _restore(out: Tensor, q: Tensor, lead, H: int) -> Tensor:
    """(B, H, Tq, Dv) back to q's leading shape."""
    Tq, Dv = out.shape[-2], out.shape[-1]
    if q.dim() >= 3:
        return out.reshape(*lead, H, Tq, Dv)
    return out.reshape(Tq, Dv)


# ----------------------------------------------------------------------------------------------
# sliding window


def window_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    is_causal: bool = True,
    scale: float,
    dropout_p: float = 0.0,
    return_weights: bool = False,
    window: int | None = None,
    chunk: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Sliding-window attention, banded (the ``window`` backend).

    Query i (at absolute position p = i + Tk − Tq, bottom-right aligned like ``is_causal``) may
    attend to key j when ``0 ≤ p − j < w`` (causal) or ``|p − j| < w`` (``is_causal=False``),
    and where ``mask`` allows.

    Args:
        q, k, v: as for :func:`attnlab.attention.scaled_dot_product_attention` (GQA allowed).
        mask: boolean, broadcastable to ``(..., H, Tq, Tk)``; combined with the window.
        bias: additive scores broadcastable like ``mask`` (only the in-band part is used).
        is_causal: one-sided (causal) or two-sided window.
        scale: score scale.
        dropout_p: dropout on the in-band weights.
        return_weights: also return the full ``(..., H, Tq, Tk)`` weights (zeros outside the band;
            this one is O(N²) and only built when asked).
        window: w, keys per query (positive int, required).
        chunk: query chunk length c (default ``max(w, 32)``, at most Tq).

    Returns:
        ``(out (..., H, Tq, Dv), weights or None)``.

    Raises:
        ValueError: ``window``/``chunk`` missing or not a positive integer.
    """
    if window is None:
        raise ValueError(
            "backend 'window' needs option window=w (a positive integer: keys each query may see)"
        )
    w = positive_int_option("window", "window", window)
    q5, k4, v4, lead, H = _canonical(q, k, v)
    B, Hkv, g, Tq, D = q5.shape
    Tk, Dv = k4.shape[-2], v4.shape[-1]
    c = (
        min(max(w, 32), max(Tq, 1))
        if chunk is None
        else positive_int_option("window", "chunk", chunk)
    )
    offset = Tk - Tq
    # reach of the band: query positions p run from offset to Tk − 1, keys from 0 to Tk − 1, so
    # no key lies more than Tk − 1 before a query or more than Tq − 1 after it
    left = min(w - 1, max(Tk - 1, 0))  # keys before the query that can be seen
    right = 0 if is_causal else min(w - 1, max(Tq - 1, 0))  # keys after it
    n = -(-Tq // c)  # chunks
    L = c + left + right  # keys one chunk can reach
    # padded key index of chunk n's first key: the key at absolute position offset + n·c − left
    pad_left = left + max(0, -offset)
    pad_right = n * c - Tq + right
    start = offset + max(0, -offset)

    def key_windows(t: Tensor, value) -> Tensor:
        """(..., Tk) -> (..., n, L): chunk n's reachable keys (padded with ``value``)."""
        t = F.pad(t, (pad_left, pad_right), value=value)[..., start:]
        return t.unfold(-1, L, c)[..., :n, :]

    # (B, Hkv, g, Tq, D) -> (B, Hkv, n, g·c, D): a chunk's queries of all g heads in one matmul
    qc = F.pad(q5, (0, 0, 0, n * c - Tq)).view(B, Hkv, g, n, c, D).transpose(2, 3)
    qc = qc.reshape(B, Hkv, n, g * c, D)
    kw = key_windows(k4.transpose(-2, -1), 0.0)  # (B, Hkv, D, n, L)
    vw = key_windows(v4.transpose(-2, -1), 0.0)  # (B, Hkv, Dv, n, L)
    s = (qc * scale) @ kw.permute(0, 1, 3, 2, 4)  # (B, Hkv, n, g·c, L)
    s = s.view(B, Hkv, n, g, c, L)

    # in-band and existing keys: row r of a chunk sees columns r … r + left + right
    r = torch.arange(c, device=q.device)[:, None]
    col = torch.arange(L, device=q.device)[None, :]
    band = (col >= r) & (col <= r + left + right)  # (c, L)
    key_pos = offset + torch.arange(n, device=q.device)[:, None] * c - left + col  # (n, L)
    exists = (key_pos >= 0) & (key_pos < Tk)
    allowed = band[None] & exists[:, None, :]  # (n, c, L)
    allowed = allowed[:, None]  # (n, 1, c, L), broadcasts over (B, Hkv, n, g, c, L)
    if mask is not None:
        allowed = allowed & _band_rows(
            _to_heads(_flatten_lead(mask, lead), H, Hkv), key_windows, n, c, Tq, False
        )
    if bias is not None:
        s = s + _band_rows(_to_heads(_flatten_lead(bias, lead), H, Hkv), key_windows, n, c, Tq, 0.0)
    s = s.masked_fill_(~allowed, float("-inf"))  # in place: one band-sized tensor, not two
    empty = ~allowed.any(dim=-1, keepdim=True)  # rows with no allowed key -> zeros, not NaN
    if empty.any():
        weights = s.masked_fill(empty, 0.0).softmax(dim=-1).masked_fill(empty, 0.0)
    else:
        weights = s.softmax(dim=-1)
    attn = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    out = attn.view(B, Hkv, n, g * c, L) @ vw.permute(0, 1, 3, 4, 2)  # (B, Hkv, n, g·c, Dv)
    out = out.view(B, Hkv, n, g, c, Dv).permute(0, 1, 3, 2, 4, 5)  # (B, Hkv, g, n, c, Dv)
    out = out.reshape(B, H, n * c, Dv)[:, :, :Tq]  # (B, H, Tq, Dv)
    full = None
    if return_weights:
        full = _scatter_band(weights, n, c, L, Tq, Tk, pad_left, pad_right, start)
        full = full.reshape(B, H, Tq, Tk)
        full = full.reshape(*lead, H, Tq, Tk) if q.dim() >= 3 else full.reshape(Tq, Tk)
    return _restore(out, q, lead, H), full


def _band_rows(t: Tensor, key_windows, n: int, c: int, Tq: int, value) -> Tensor:
    """A (B|1, Hkv|1, Tq|1, g|1, Tk|1) mask/bias -> banded (B|1, Hkv|1, n|1, g|1, c|1, L|1)."""
    Bm, Hx, tq, gx, tk = t.shape
    if tk == 1:
        if tq == 1:
            return t.view(Bm, Hx, 1, gx, 1, 1)
        t = F.pad(t, (0, 0, 0, 0, 0, n * c - Tq), value=value)
        return t.view(Bm, Hx, n, c, gx, 1).transpose(3, 4)
    if tq == 1:
        return key_windows(t, value).permute(0, 1, 4, 3, 2, 5)  # (Bm, Hx, n, gx, 1, L)
    t = F.pad(t, (0, 0, 0, 0, 0, n * c - Tq), value=value)  # rows padded to n·c
    kw = key_windows(t, value)  # (Bm, Hx, n·c, gx, n, L), a view
    kw = kw.reshape(Bm, Hx, n, c, gx, n, kw.shape[-1])
    # row r of chunk m needs the key window of chunk m: the diagonal over the two chunk dims
    return torch.diagonal(kw, dim1=2, dim2=5).permute(0, 1, 5, 3, 2, 4)  # (Bm, Hx, n, gx, c, L)


def _scatter_band(weights, n, c, L, Tq, Tk, pad_left, pad_right, start) -> Tensor:
    """Banded (B, Hkv, n, g, c, L) weights -> full (B, Hkv, g, Tq, Tk), zeros off the band."""
    B, Hkv, _, g, _, _ = weights.shape
    width = Tk + pad_left + pad_right
    idx = (
        start
        + torch.arange(n, device=weights.device)[:, None] * c
        + torch.arange(L, device=weights.device)
    )  # (n, L) padded key index
    idx = idx[None, None, :, None, None, :].expand(B, Hkv, n, g, c, L)
    full = weights.new_zeros(B, Hkv, n, g, c, width).scatter(-1, idx, weights)
    full = full[..., pad_left : pad_left + Tk]  # (B, Hkv, n, g, c, Tk)
    full = full.permute(0, 1, 3, 2, 4, 5).reshape(B, Hkv, g, n * c, Tk)[..., :Tq, :]
    return full


# ----------------------------------------------------------------------------------------------
# linear attention


def elu_feature_map(x: Tensor) -> Tensor:
    """φ(x) = elu(x) + 1, positive (Katharopoulos et al. 2020).

    Written as x + 1 (x > 0) or exp(x) (x ≤ 0): the same function, but 1 + (exp(x) − 1) would
    round to exactly 0 in fp32 below x ≈ −17 and leave a query with nothing to attend to.
    """
    return torch.where(x > 0, x + 1.0, torch.exp(x.clamp(max=0.0)))


_PROJECTIONS: dict[tuple, Tensor] = {}


def favor_projection(dim: int, n_features: int, seed: int = 0) -> Tensor:
    """Orthogonal random features ω ``(n_features, dim)`` for FAVOR+ (cached, deterministic).

    Blocks of ``dim`` orthonormal rows (QR of a Gaussian matrix), each row rescaled to the norm of
    a Gaussian vector so every ω is marginally N(0, I) while rows within a block are orthogonal
    (lower variance than i.i.d. features).
    """
    key = (dim, n_features, seed)
    if key not in _PROJECTIONS:
        gen = torch.Generator().manual_seed(seed)
        blocks = []
        for _ in range(-(-n_features // dim)):
            qmat, _ = torch.linalg.qr(torch.randn(dim, dim, generator=gen, dtype=torch.float64))
            blocks.append(qmat.T)
        omega = torch.cat(blocks)[:n_features]
        norms = torch.randn(n_features, dim, generator=gen, dtype=torch.float64).norm(dim=1)
        _PROJECTIONS[key] = omega * norms[:, None]
    return _PROJECTIONS[key]


def favor_features(x: Tensor, omega: Tensor, *, stabilise: str = "row") -> Tensor:
    """FAVOR+ positive features φ(x) = exp(ωᵀx − |x|²/2 − c)/√F.

    ``c`` is a stabiliser that cancels in the attention normalisation: ``row`` uses each row's own
    maximum (queries; exact per row), ``all`` one maximum over the whole tensor except the last two
    dims (non-causal keys), ``none`` leaves it at 0 (causal keys, so no future key can change the
    past).
    """
    proj = x @ omega.T.to(x.dtype)  # (..., T, F)
    arg = proj - 0.5 * (x * x).sum(dim=-1, keepdim=True)
    if stabilise == "row":
        arg = arg - arg.amax(dim=-1, keepdim=True).detach()
    elif stabilise == "all":
        arg = arg - arg.amax(dim=(-2, -1), keepdim=True).detach()
    return arg.exp() / math.sqrt(omega.shape[0])


#: the ``linear`` backend's options besides ``feature_map``
_LINEAR_OPTIONS = ("n_features", "seed", "chunk")


def linear_attention(
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
    feature_map: str = "elu",
    **favor: int,
) -> tuple[Tensor, None]:
    """Kernelised linear attention (the ``linear`` backend).

    Args:
        q, k, v: as for :func:`attnlab.attention.scaled_dot_product_attention` (GQA allowed).
        mask: key-padding only: boolean broadcastable to ``(..., H, 1, Tk)``.
        bias: not supported (there is no score matrix to add it to).
        is_causal: causal prefix-sum form (bottom-right aligned when Tq != Tk).
        scale: score scale; FAVOR+ estimates exp(q·k·scale), ``elu`` ignores it.
        dropout_p: must be 0.
        return_weights: must be False.
        feature_map: ``elu`` or ``favor``.
        **favor: ``n_features``, random features F for ``favor`` (default 256); ``seed``, the
            seed of the FAVOR+ projection (default 0: fixed, so training and evaluation agree);
            ``chunk``, the chunk length of the causal form (default 128; memory
            O(N/chunk · F · Dv) for the prefix states).

    Returns:
        ``(out (..., H, Tq, Dv), None)``.

    Raises:
        ValueError: an unknown feature map, bad ``n_features``/``chunk``, a bias, or a mask that
            depends on the query.
    """
    if feature_map not in ("elu", "favor"):
        raise ValueError(
            f"backend 'linear': option feature_map must be 'elu' or 'favor', got {feature_map!r}"
        )
    unknown = sorted(set(favor) - set(_LINEAR_OPTIONS))
    if unknown:
        raise ValueError(f"backend 'linear' does not take option(s) {unknown}")
    n_features = positive_int_option("linear", "n_features", favor.get("n_features", 256))
    chunk = positive_int_option("linear", "chunk", favor.get("chunk", 128))
    seed = favor.get("seed", 0)
    if bias is not None:
        raise ValueError(
            "backend 'linear' cannot add a score bias (bias=...): it never forms the "
            "scores; use backend='math', 'sdpa' or 'tiled'"
        )
    q5, k4, v4, lead, H = _canonical(q, k, v)
    B, Hkv, g, Tq, D = q5.shape
    Tk = k4.shape[-2]
    if feature_map == "elu":
        fq, fk = elu_feature_map(q5), elu_feature_map(k4)  # (B, Hkv, g, Tq, D), (B, Hkv, Tk, D)
    else:
        omega = favor_projection(D, n_features, seed).to(q.device)
        root = math.sqrt(scale)  # exp(q·k·scale) = exp((√scale q)·(√scale k))
        fq = favor_features(q5 * root, omega, stabilise="row")
        fk = favor_features(k4 * root, omega, stabilise="none" if is_causal else "all")
    fk = fk[:, :, None]  # (B, Hkv, 1, Tk, F): shared by the g query heads of a group
    v5 = v4[:, :, None]  # (B, Hkv, 1, Tk, Dv)
    if mask is not None:
        m = _to_heads(_flatten_lead(mask, lead), H, Hkv)  # (B|1, Hkv|1, Tq|1, g|1, Tk|1)
        if m.shape[2] != 1:
            raise ValueError(
                f"backend 'linear' supports key-padding masks only (mask "
                f"broadcastable to (..., H, 1, Tk)); got mask of shape "
                f"{tuple(mask.shape)}"
            )
        fk = fk * m.permute(0, 1, 3, 4, 2).to(fk.dtype)  # masked keys contribute nothing
    if is_causal:
        num, den = _causal_sums(fq, fk, v5, Tq, Tk, chunk)
    else:
        kv = fk.transpose(-2, -1) @ v5  # (B, Hkv, g|1, F, Dv)
        num = fq @ kv  # (B, Hkv, g, Tq, Dv)
        den = fq @ fk.sum(dim=-2).unsqueeze(-1)  # (B, Hkv, g, Tq, 1)
    out = num / den.masked_fill(den == 0, 1.0)  # no visible key -> zeros
    return _restore(out.reshape(-1, H, Tq, out.shape[-1]), q, lead, H), None


def _causal_sums(fq: Tensor, fk: Tensor, v: Tensor, Tq: int, Tk: int, chunk: int):
    """Causal numerator Σ_{j≤p} (φq_i·φk_j) v_j and denominator Σ_{j≤p} φq_i·φk_j, chunked."""
    T = max(Tq, Tk)
    # align on a common time axis: queries are the last Tq positions, keys the last Tk
    fq = F.pad(fq, (0, 0, T - Tq, 0))
    fk = F.pad(fk, (0, 0, T - Tk, 0))  # zero features: absent keys count for nothing
    v = F.pad(v, (0, 0, T - Tk, 0))
    c = min(chunk, T)
    n = -(-T // c)
    extra = n * c - T

    def chunks(t: Tensor) -> Tensor:  # (..., T, X) -> (..., n, c, X)
        return F.pad(t, (0, 0, 0, extra)).unflatten(-2, (n, c))

    fq_c, fk_c, v_c = chunks(fq), chunks(fk), chunks(v)
    kv = fk_c.transpose(-2, -1) @ v_c  # (B, Hkv, g|1, n, F, Dv)
    # exclusive prefix sums (keys of earlier chunks): shift the inclusive sum by one chunk
    state = F.pad(kv.cumsum(dim=-3)[..., :-1, :, :], (0, 0, 0, 0, 1, 0))
    z = fk_c.sum(dim=-2)  # (B, Hkv, g|1, n, F)
    z_state = F.pad(z.cumsum(dim=-2)[..., :-1, :], (0, 0, 1, 0)).unsqueeze(-1)  # (.., n, F, 1)
    a = (fq_c @ fk_c.transpose(-2, -1)).tril()  # (B, Hkv, g, n, c, c), within-chunk causal
    num = fq_c @ state + a @ v_c  # (B, Hkv, g, n, c, Dv)
    den = fq_c @ z_state + a.sum(dim=-1, keepdim=True)  # (B, Hkv, g, n, c, 1)
    num = num.flatten(-3, -2)[..., T - Tq : T, :]  # (B, Hkv, g, Tq, Dv)
    den = den.flatten(-3, -2)[..., T - Tq : T, :]
    return num, den


register_backend("window", window_attention, returns_weights=True)
register_backend(
    "linear", linear_attention, dropout=False, options=("feature_map", *_LINEAR_OPTIONS)
)
