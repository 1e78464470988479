"""Scaled dot-product attention: the formula first, then the masks, then the faster backends.

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V

Shape legend: B batch, H heads, Hkv key/value heads, Tq queries, Tk keys, D key width (d_k),
Dv value width (d_v). Leading dimensions ``...`` are any batch/head dimensions.

Mask convention (the only one in attnlab): a boolean ``mask`` is ``True`` where a query may attend
to a key. ``is_causal=True`` adds the causal constraint; with ``Tq < Tk`` (decoding with a KV cache)
the queries are the *last* ``Tq`` positions, so query ``i`` sees keys ``0 .. Tk - Tq + i``. A float
``bias`` (ALiBi, relative-position bias) is added to the scores. A query row with no allowed key
produces zeros, never NaN.

Backends, chosen in :func:`scaled_dot_product_attention` and nowhere else:

- ``math``: :func:`math_attention`, the formula as written; the reference, can return the weights.
- ``sdpa``: PyTorch's fused ``torch.nn.functional.scaled_dot_product_attention``.
- further backends (``tiled``, ``window``, ``linear``, ``block_sparse``; ``decode`` from
  :mod:`attnlab.fast`) register themselves through :func:`register_backend`.
- ``auto``: ``sdpa`` unless the weights are requested, then ``math``.
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "math_attention",
    "attention_scores",
    "scaled_dot_product_attention",
    "sdpa_attention",
    "causal_mask",
    "padding_mask",
    "key_padding_mask",
    "combine_masks",
    "repeat_kv",
    "register_backend",
    "available_backends",
    "check_backend",
    "backend_for_weights",
]


# ----------------------------------------------------------------------------------------------
# the formula


def math_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None,
    bias: Tensor | None,
    is_causal: bool,
    scale: float,
    dropout_p: float,
    return_weights: bool,
) -> tuple[Tensor, Tensor | None]:
    """``softmax(Q Kᵀ · scale + bias, masked) V`` step by step: ``(out (..., Tq, Dv), weights)``.

    q ``(..., H, Tq, D)``, k ``(..., Hkv, Tk, D)``, v ``(..., Hkv, Tk, Dv)``; the arguments are
    those of :func:`scaled_dot_product_attention` (``scale`` is 1/√d_k there by default; the
    weights are returned when asked, else None).
    """
    if is_causal:  # query i sees keys 0 .. Tk − Tq + i
        mask = combine_masks(mask, causal_mask(q.shape[-2], k.shape[-2], device=q.device))
    scores = attention_scores(q, k, mask=mask, scale=scale, bias=bias)  # (..., Tq, Tk)
    if mask is not None:  # a query with no allowed key: zeros, not softmax(−∞, …, −∞) = NaN
        empty = ~mask.any(dim=-1, keepdim=True)  # (..., Tq, 1)
        scores = scores.masked_fill(empty, 0.0)
    weights = scores.softmax(dim=-1)  # (..., Tq, Tk), each row sums to 1
    if mask is not None:
        weights = weights.masked_fill(empty, 0.0)
    attn = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    out = attn @ repeat_kv(v, _group(q, v))  # (..., Tq, Dv): a weighted sum of the values
    return out, (weights if return_weights else None)


def attention_scores(
    q: Tensor,
    k: Tensor,
    *,
    mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    bias: Tensor | None = None,
) -> Tensor:
    """The raw scores ``Q Kᵀ · scale + bias`` ``(..., Tq, Tk)``, ``-inf`` where a query may not
    attend: ``softmax(scores)`` is :func:`math_attention`'s weights (a fully masked row aside).

    Args:
        q, k, mask, is_causal, scale, bias: as in :func:`scaled_dot_product_attention`.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    scores = (q @ repeat_kv(k, _group(q, k)).transpose(-2, -1)) * scale  # (..., Tq, Tk)
    if bias is not None:
        scores = scores + bias  # ALiBi, T5's buckets, Swin's table: added to the scores
    if is_causal:
        mask = combine_masks(mask, causal_mask(q.shape[-2], k.shape[-2], device=q.device))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """(B, Hkv, T, D) -> (B, Hkv·n_rep, T, D); KV head j serves query heads j·n_rep … (j+1)·n_rep−1."""
    if n_rep == 1:
        return x
    return x.repeat_interleave(n_rep, dim=-3)


def _group(q: Tensor, kv: Tensor) -> int:
    """Query heads per key/value head (grouped-query attention; 1 for 2-D inputs)."""
    return q.shape[-3] // kv.shape[-3] if q.dim() >= 3 and kv.dim() >= 3 else 1


# ----------------------------------------------------------------------------------------------
# masks


def causal_mask(
    n_q: int, n_k: int | None = None, *, device: torch.device | str | None = None
) -> Tensor:
    """Boolean ``(n_q, n_k)`` mask, ``True`` on and below the (bottom-right aligned) diagonal.

    With ``n_k > n_q`` the queries are the last ``n_q`` positions of the key sequence, as when
    decoding with a KV cache.
    """
    n_k = n_q if n_k is None else n_k
    offset = n_k - n_q
    return torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril(diagonal=offset)


def padding_mask(lengths: Tensor | list[int], max_len: int | None = None) -> Tensor:
    """Boolean ``(B, max_len)`` mask, ``True`` for the first ``lengths[b]`` (real) positions."""
    lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be 1-D (B,), got shape {tuple(lengths.shape)}")
    max_len = int(lengths.max()) if max_len is None else max_len
    if int(lengths.max()) > max_len:
        raise ValueError(f"a length {int(lengths.max())} exceeds max_len={max_len}")
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


def key_padding_mask(lengths_or_mask: Tensor | list[int], max_len: int | None = None) -> Tensor:
    """Key padding as an attention mask ``(B, 1, 1, Tk)`` that broadcasts over heads and queries.

    Accepts either lengths ``(B,)`` or a boolean ``(B, Tk)`` "is real token" mask.
    """
    t = torch.as_tensor(lengths_or_mask)
    if t.dtype != torch.bool:
        t = padding_mask(t, max_len)
    if t.dim() != 2:
        raise ValueError(f"key padding mask must be (B, Tk), got shape {tuple(t.shape)}")
    return t[:, None, None, :]


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of boolean masks with broadcasting; ``None`` entries are ignored."""
    out: Tensor | None = None
    for m in masks:
        if m is None:
            continue
        if m.dtype != torch.bool:
            raise ValueError(f"masks must be boolean (True = may attend), got {m.dtype}")
        out = m if out is None else out & m
    return out


# ----------------------------------------------------------------------------------------------
# backends


# arguments every backend takes; anything else a backend accepts is one of its options
_COMMON_ARGS = {"q", "k", "v", "mask", "bias", "is_causal", "scale", "dropout_p", "return_weights"}

# name -> fn(q, k, v, *, mask, bias, is_causal, scale, dropout_p, return_weights, **options)
#         returning (out, weights_or_None). q/k/v already validated; k/v may have fewer heads (GQA).
_BACKENDS: dict[str, Callable[..., tuple[Tensor, Tensor | None]]] = {}
# backends that can return attention weights
_WEIGHT_BACKENDS: set[str] = set()
# backends that implement dropout on the attention weights
_DROPOUT_BACKENDS: set[str] = set()
# backend name -> the option names its function takes (None: it takes any **options)
_BACKEND_OPTIONS: dict[str, frozenset[str] | None] = {}
# backend name -> check(options, dropout_p) used by check_backend instead of a probe run
_BACKEND_CHECKS: dict[str, Callable[[dict[str, Any], float], None]] = {}


def register_backend(
    name: str,
    fn: Callable[..., tuple[Tensor, Tensor | None]],
    *,
    returns_weights: bool = False,
    dropout: bool = True,
    check: Callable[[dict[str, Any], float], None] | None = None,
    options: tuple[str, ...] | None = None,
) -> None:
    """Make ``fn`` selectable as ``backend=name``.

    ``fn(q, k, v, *, mask, bias, is_causal, scale, dropout_p, return_weights, **options)`` must return
    ``(out, weights or None)``. k/v may carry fewer heads than q (grouped-query attention).
    A backend registered without ``returns_weights`` (or without ``dropout``) is never called
    with ``return_weights=True`` (or ``dropout_p > 0``): the request is refused before, with one
    message naming the backend. ``check(options, dropout_p)``, if given, validates options without
    running (for options that depend on the sequence, such as token indices, which a tiny probe
    input cannot satisfy). ``options`` names the options of a function that takes them as
    ``**options`` (default: the keyword parameters of ``fn`` beyond the common ones).
    """
    _BACKENDS[name] = fn
    if returns_weights:
        _WEIGHT_BACKENDS.add(name)
    if dropout:
        _DROPOUT_BACKENDS.add(name)
    if check is not None:
        _BACKEND_CHECKS[name] = check
    params = inspect.signature(fn).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if options is not None:
        _BACKEND_OPTIONS[name] = frozenset(options)
    else:
        _BACKEND_OPTIONS[name] = None if takes_any else frozenset(params) - _COMMON_ARGS


def available_backends() -> list[str]:
    """Names accepted by ``backend=`` (besides ``auto``)."""
    _load_optional_backends()
    return sorted(_BACKENDS)


def _load_optional_backends() -> None:
    # Optional backends live in their own files; importing them registers them.
    for mod in (
        "attnlab.attention.tiled",
        "attnlab.attention.efficient",
        "attnlab.attention.sparse",
    ):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as err:  # pragma: no cover - only while a file is missing
            if err.name != mod:
                raise


def sdpa_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None,
    bias: Tensor | None,
    is_causal: bool,
    scale: float,
    dropout_p: float,
    return_weights: bool,
) -> tuple[Tensor, Tensor | None]:
    """The ``sdpa`` backend: :func:`math_attention`'s numbers from torch's fused kernel (no
    weights)."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    gqa = q.dim() >= 3 and k.shape[-3] != q.shape[-3]
    if gqa and q.dim() != 4:
        k, v = repeat_kv(k, q.shape[-3] // k.shape[-3]), repeat_kv(v, q.shape[-3] // k.shape[-3])
        gqa = False
    # torch's is_causal is top-left aligned; ours is bottom-right, so build the mask when they differ
    use_flag = is_causal and mask is None and bias is None and n_q == n_k
    allowed = mask
    if is_causal and not use_flag:
        allowed = combine_masks(mask, causal_mask(n_q, n_k, device=q.device))
    attn_mask: Tensor | None = allowed
    empty_row = None
    if allowed is not None:
        empty_row = ~allowed.any(dim=-1, keepdim=True)
        # a fully masked row would give NaN: let it attend everywhere, zero it afterwards
        allowed = allowed | empty_row
        attn_mask = allowed
    if bias is not None:
        attn_mask = bias if allowed is None else bias.masked_fill(~allowed, float("-inf"))
        attn_mask = attn_mask.to(q.dtype)
    out = F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=attn_mask,
        dropout_p=dropout_p,
        is_causal=use_flag,
        scale=scale,
        **({"enable_gqa": True} if gqa else {}),
    )
    if empty_row is not None:
        out = out.masked_fill(empty_row, 0.0)
    return out, None


register_backend("math", math_attention, returns_weights=True)
register_backend("sdpa", sdpa_attention)


# ----------------------------------------------------------------------------------------------
# the public entry point


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    backend: str = "auto",
    return_weights: bool = False,
    bias: Tensor | None = None,
    **options: Any,
) -> Tensor | tuple[Tensor, Tensor]:
    """softmax(Q Kᵀ · scale + bias, masked) V, through the chosen backend.

    Args:
        q: queries ``(..., Tq, D)``; with 4-D inputs ``(B, H, Tq, D)``.
        k: keys ``(..., Tk, D)``; may have fewer heads than q (``H % Hkv == 0``, grouped-query).
        v: values ``(..., Tk, Dv)``; same leading shape as k.
        mask: boolean, broadcastable to ``(..., Tq, Tk)``; ``True`` = may attend.
        is_causal: also forbid keys after the query (bottom-right aligned when ``Tq != Tk``).
        scale: multiplies the scores; default ``1/√D``.
        dropout_p: dropout on the attention weights (pass 0.0 at evaluation).
        backend: ``auto`` | ``math`` | ``sdpa`` | any registered backend (see
            :func:`available_backends`).
        return_weights: also return the ``(..., Tq, Tk)`` weights (math-type backends only).
        bias: float tensor added to the scores, broadcastable to ``(..., Tq, Tk)`` (ALiBi, relative
            position bias).
        **options: backend-specific options (``block_q``/``block_k`` for ``tiled``, ``window`` for
            ``window``, ``feature_map`` for ``linear``...).

    Returns:
        ``out (..., Tq, Dv)``, or ``(out, weights)`` when ``return_weights``.

    Raises:
        ValueError: mismatched shapes or widths, a mask that does not broadcast, an unknown backend,
            or a backend that cannot honour the request.
    """
    _check_inputs(q, k, v, mask, bias)
    if backend == "auto":
        backend = "math" if return_weights else "sdpa"
    if backend not in _BACKENDS:
        _load_optional_backends()
    if backend not in _BACKENDS:
        raise ValueError(
            f"unknown attention backend {backend!r}; choose from {['auto', *available_backends()]}"
        )
    if return_weights and backend not in _WEIGHT_BACKENDS:
        raise ValueError(
            f"backend {backend!r} cannot return attention weights "
            f"(return_weights=True); use backend='math'"
        )
    _check_dropout(backend, dropout_p)
    if options:
        _check_options(backend, options)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    out, weights = _BACKENDS[backend](
        q,
        k,
        v,
        mask=mask,
        bias=bias,
        is_causal=is_causal,
        scale=scale,
        dropout_p=dropout_p,
        return_weights=return_weights,
        **options,
    )
    return (out, weights) if return_weights else out


def backend_for_weights(backend: str) -> str:
    """The backend to use when the attention weights are wanted (a capture, ``need_weights``).

    Exact backends that compute no weights (``auto``, ``sdpa``, ``tiled``) give way to ``math``,
    which computes the same numbers explicitly.

    Raises:
        ValueError: an approximate backend (``window``, ``linear``...), whose weights do not exist.
    """
    if backend in ("auto", "sdpa", "tiled"):
        return "math"
    if backend not in _BACKENDS:
        _load_optional_backends()
    if backend in _WEIGHT_BACKENDS:
        return backend
    raise ValueError(
        f"backend {backend!r} computes no attention weights to show; use an exact backend "
        "(auto, sdpa, math, tiled) to read them"
    )


def _check_dropout(backend: str, dropout_p: float) -> None:
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if dropout_p > 0 and backend not in _DROPOUT_BACKENDS:
        raise ValueError(
            f"backend {backend!r} does not implement attention dropout (dropout_p={dropout_p}); "
            "use dropout_p=0 (attn_dropout=0) or backend='math'/'sdpa'"
        )


def _check_options(backend: str, options: dict[str, Any]) -> None:
    accepted = _BACKEND_OPTIONS[backend]
    if accepted is None:
        return
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ValueError(
            f"backend {backend!r} does not take option(s) {unknown}; "
            f"its options: {sorted(accepted) or 'none'}"
        )


def check_backend(
    backend: str, options: dict[str, Any] | None = None, *, dropout_p: float = 0.0
) -> None:
    """Raise ``ValueError`` now if ``backend`` cannot run with ``options`` and ``dropout_p``.

    Model configs call this when they are built, so a bad choice (``window`` without a window, a
    misspelled option, dropout on ``tiled``) fails before a run directory is written, not at the
    first forward pass. It runs the backend once on a tiny causal input, or the backend's own
    ``check`` when it registered one.
    """
    if backend not in _BACKENDS and backend != "auto":
        _load_optional_backends()
    if backend in _BACKEND_CHECKS:
        if options:
            _check_options(backend, options)
        _check_dropout(backend, dropout_p)
        _BACKEND_CHECKS[backend](dict(options or {}), dropout_p)
        return
    x = torch.zeros(1, 1, 2, 8)
    scaled_dot_product_attention(
        x, x, x, is_causal=True, dropout_p=dropout_p, backend=backend, **(options or {})
    )


def _check_inputs(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None
) -> None:
    if q.dim() < 2 or k.dim() < 2 or v.dim() < 2:
        raise ValueError(
            f"q, k, v need at least 2 dims (..., T, D); got q{tuple(q.shape)} "
            f"k{tuple(k.shape)} v{tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same width d_k: q{tuple(q.shape)} vs k{tuple(k.shape)}"
        )
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(
            f"k and v must agree in all but the last dim: k{tuple(k.shape)} vs v{tuple(v.shape)}"
        )
    if q.dim() != k.dim():
        raise ValueError(f"q and k must have the same rank: q{tuple(q.shape)} vs k{tuple(k.shape)}")
    if q.dim() >= 3:
        hq, hk = q.shape[-3], k.shape[-3]
        if hq % hk != 0:
            raise ValueError(
                f"query heads ({hq}) must be a multiple of key/value heads ({hk}): "
                f"q{tuple(q.shape)} k{tuple(k.shape)}"
            )
        if q.shape[:-3] != k.shape[:-3]:
            raise ValueError(f"q and k batch dims differ: q{tuple(q.shape)} vs k{tuple(k.shape)}")
    scores_shape = (*q.shape[:-1], k.shape[-2])
    for name, t in (("mask", mask), ("bias", bias)):
        if t is None:
            continue
        if name == "mask" and t.dtype != torch.bool:
            raise ValueError(
                f"mask must be boolean (True = may attend), got dtype {t.dtype}; "
                "pass additive float scores as bias="
            )
        try:
            if torch.broadcast_shapes(t.shape, scores_shape) != torch.Size(scores_shape):
                raise RuntimeError
        except RuntimeError:
            raise ValueError(
                f"{name} of shape {tuple(t.shape)} does not broadcast to the scores "
                f"(..., Tq, Tk) = {scores_shape}"
            ) from None
