"""Sparse attention patterns (Longformer, BigBird) and a block-sparse backend that skips empty tiles.

A sparse pattern is a boolean mask (True = may attend) in which each query sees O(w) keys instead
of N:

- **Longformer** (Beltagy et al. 2020): a sliding window, query at position p sees key j when
  ``|p − j| < window`` (``0 ≤ p − j < window`` once combined with ``is_causal``), plus *global*
  tokens that see every key and are seen by every query.
- **BigBird** (Zaheer et al. 2020): the sequence is cut into blocks of ``block_size``; a query block
  sees the ``window_blocks`` neighbouring blocks on each side (and its own), ``random_blocks``
  other key blocks chosen at random (seeded, per query block), and the global tokens.

Positions are absolute and, as everywhere in attnlab, queries are bottom-right aligned: with
``Tq < Tk`` (a KV-cache step) query i sits at position ``i + Tk − Tq``, so a cached decoding step
sees exactly the row of the full pattern. BigBird's random blocks come from earlier blocks only
when attention is causal (``is_causal``, or fewer queries than keys as in a KV-cache step), so
generating token by token draws the same blocks as the full forward pass.

The ``block_sparse`` backend is the ``tiled`` backend (online softmax, recomputing backward) run
only on the *live* tiles of the score matrix, those with at least one allowed entry. A tile that
the pattern, the mask and the causal constraint leave fully masked is never computed, forward or
backward (:func:`attnlab.attention.tiled.count_tiles` records the tiles computed). Inside a live
tile the mask is applied exactly, so the result equals ``math`` with the same mask.

Shape legend: B batch, H heads, Tq queries, Tk keys, D head width, b block (tile) size,
nq = ⌈Tq/b⌉ query blocks, nk = ⌈Tk/b⌉ key blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from attnlab.attention.core import combine_masks, register_backend, scaled_dot_product_attention
from attnlab.attention.tiled import positive_int_option, tiled_forward

__all__ = [
    "PATTERNS",
    "longformer_mask",
    "bigbird_mask",
    "pattern_mask",
    "tile_mask",
    "expand_block_mask",
    "block_sparse_attention",
    "DEFAULT_BLOCK_SIZE",
]

#: patterns known to :func:`pattern_mask` and the ``block_sparse`` backend, with their options
PATTERNS: dict[str, tuple[str, ...]] = {
    "longformer": ("window", "global_tokens"),
    "bigbird": ("window_blocks", "random_blocks", "seed", "global_tokens"),
}
#: every pattern option (the ``block_sparse`` backend takes them besides its own)
PATTERN_OPTIONS = ("window", "global_tokens", "window_blocks", "random_blocks", "seed")
#: tile (and BigBird block) size of the block-sparse backend
DEFAULT_BLOCK_SIZE = 64
_BIGBIRD_DEFAULTS = {"window_blocks": 1, "random_blocks": 2, "seed": 0}


# ----------------------------------------------------------------------------------------------
# patterns as masks


def _check_global_tokens(global_tokens: Sequence[int], n: int | None) -> list[int]:
    """Validate global token indices (against the sequence length ``n`` when known)."""
    if isinstance(global_tokens, Tensor):
        global_tokens = global_tokens.tolist()
    if isinstance(global_tokens, (str, bytes)) or not isinstance(global_tokens, Sequence):
        raise ValueError(f"global_tokens must be a list of token indices, got {global_tokens!r}")
    out = []
    for g in global_tokens:
        if isinstance(g, bool) or not isinstance(g, int):
            raise ValueError(f"global token index {g!r} is not an integer")
        if g < 0 or (n is not None and g >= n):
            where = f"the sequence of length {n} (0 … {n - 1})" if n is not None else "0 …"
            raise ValueError(f"global token index {g} is outside {where}")
        out.append(g)
    return out


def _add_global(mask: Tensor, global_tokens: list[int], offset: int) -> Tensor:
    """Global keys are seen by every query; global queries see every key."""
    if global_tokens:
        n_q = mask.shape[0]
        idx = torch.tensor(global_tokens, dtype=torch.long, device=mask.device)
        mask[:, idx] = True
        rows = idx - offset  # query row of each global position (queries are the last n_q)
        mask[rows[(rows >= 0) & (rows < n_q)]] = True
    return mask


def longformer_mask(
    n_q: int,
    n_k: int | None = None,
    *,
    window: int,
    global_tokens: Sequence[int] = (),
    device: torch.device | str | None = None,
) -> Tensor:
    """Longformer's sliding window plus global tokens, a boolean ``(n_q, n_k)`` mask.

    Query i (position ``p = i + n_k − n_q``) may attend to key j when ``|p − j| < window`` or
    either of them is a global token. Combine with ``is_causal`` for the one-sided window.

    Raises:
        ValueError: a window that is not a positive integer, a global index outside the keys.
    """
    n_k = n_q if n_k is None else n_k
    w = positive_int_option("block_sparse", "window", window)
    glob = _check_global_tokens(global_tokens, n_k)
    offset = n_k - n_q
    ones = torch.ones(n_q, n_k, dtype=torch.bool, device=device)
    # keys with j − i in [offset − w + 1, offset + w − 1], i.e. |p − j| < w
    band = ones.tril(offset + w - 1) & ones.triu(offset - w + 1)
    return _add_global(band, glob, offset)


def bigbird_mask(
    n_q: int,
    n_k: int | None = None,
    *,
    block_size: int,
    window_blocks: int = 1,
    random_blocks: int = 2,
    seed: int = 0,
    global_tokens: Sequence[int] = (),
    causal: bool = False,
    device: torch.device | str | None = None,
) -> Tensor:
    """BigBird's block pattern: window blocks + random blocks + global tokens, ``(n_q, n_k)``.

    Blocks are of absolute positions: position p is in block ``p // block_size``. Query block a
    sees key block c when ``|a − c| ≤ window_blocks``, when c is one of a's ``random_blocks``
    random blocks, or through a global token. Random blocks are drawn, per query block, from the
    blocks outside the window (only earlier ones when ``causal``) with a generator seeded by
    ``(seed, a)``, so a block's draws do not depend on the sequence length when causal.

    Raises:
        ValueError: sizes that are not positive/non-negative integers, a global index outside the
            keys.
    """
    n_k = n_q if n_k is None else n_k
    b = positive_int_option("block_sparse", "block_size", block_size)
    _check_bigbird_counts(window_blocks, random_blocks, seed)
    glob = _check_global_tokens(global_tokens, n_k)
    offset = n_k - n_q
    n_blocks = -(-n_k // b)
    qb = torch.arange(n_blocks)[:, None]
    kb = torch.arange(n_blocks)[None, :]
    blocks = (qb - kb).abs() <= window_blocks  # (n_blocks, n_blocks) window
    if random_blocks > 0:
        for a in range(n_blocks):
            if causal:
                candidates = torch.arange(0, max(a - window_blocks, 0))
            else:
                candidates = torch.nonzero(~blocks[a]).flatten()
            if len(candidates) == 0:
                continue
            gen = torch.Generator().manual_seed(seed * 1_000_003 + a)
            pick = torch.randperm(len(candidates), generator=gen)[:random_blocks]
            blocks[a, candidates[pick]] = True
    q_block = (torch.arange(n_q) + offset) // b  # (n_q,) block of each query row
    k_block = torch.arange(n_k) // b  # (n_k,)
    mask = blocks[q_block][:, k_block].to(device)  # (n_q, n_k)
    return _add_global(mask, glob, offset)


def _check_bigbird_counts(window_blocks: Any, random_blocks: Any, seed: Any) -> None:
    for name, value in (("window_blocks", window_blocks), ("random_blocks", random_blocks)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"bigbird: {name} must be a non-negative integer, got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"bigbird: seed must be an integer, got {seed!r}")


def pattern_mask(
    pattern: str,
    n_q: int,
    n_k: int | None = None,
    *,
    causal: bool = False,
    block_size: int = DEFAULT_BLOCK_SIZE,
    device: torch.device | str | None = None,
    **options: Any,
) -> Tensor:
    """The boolean ``(n_q, n_k)`` mask of a named pattern (what ``block_sparse`` applies).

    Args:
        pattern: ``longformer`` (options ``window``, ``global_tokens``) or ``bigbird``
            (``window_blocks``, ``random_blocks``, ``seed``, ``global_tokens``; blocks of
            ``block_size``).
        n_q, n_k: queries and keys (queries bottom-right aligned).
        causal: BigBird draws its random blocks from earlier blocks only.
        block_size: BigBird's block.

    Raises:
        ValueError: an unknown pattern, an option the pattern does not take, bad values.
    """
    opts = _pattern_options(pattern, options)
    if pattern == "longformer":
        return longformer_mask(n_q, n_k, device=device, **opts)
    return bigbird_mask(n_q, n_k, block_size=block_size, causal=causal, device=device, **opts)


def _pattern_options(pattern: Any, options: dict[str, Any]) -> dict[str, Any]:
    """Check a pattern's name and options; fill BigBird's defaults."""
    if pattern not in PATTERNS:
        raise ValueError(f"unknown sparse pattern {pattern!r}; choose from {sorted(PATTERNS)}")
    given = {k: v for k, v in options.items() if v is not None}
    extra = sorted(set(given) - set(PATTERNS[pattern]))
    if extra:
        raise ValueError(
            f"sparse pattern {pattern!r} does not take {extra}; its options: "
            f"{list(PATTERNS[pattern])}"
        )
    if pattern == "longformer" and "window" not in given:
        raise ValueError(
            "sparse pattern 'longformer' needs window=w (a positive integer: a query sees keys "
            "closer than w)"
        )
    if pattern == "bigbird":
        given = {**_BIGBIRD_DEFAULTS, **given}
    return given


# ----------------------------------------------------------------------------------------------
# tiles


def tile_mask(mask: Tensor, block_q: int, block_k: int) -> Tensor:
    """Which ``(block_q, block_k)`` tiles of a boolean ``(Tq|1, Tk|1)`` mask hold an allowed entry.

    A dimension of size 1 (a broadcast mask) stays size 1. Returns ``(nq|1, nk|1)``.
    """
    m = mask
    if m.shape[0] != 1:
        n = -(-m.shape[0] // block_q)
        m = torch.nn.functional.pad(m, (0, 0, 0, n * block_q - m.shape[0]))
        m = m.view(n, block_q, m.shape[-1]).any(dim=1)  # (nq, Tk|1)
    if m.shape[1] != 1:
        n = -(-m.shape[1] // block_k)
        m = torch.nn.functional.pad(m, (0, n * block_k - m.shape[1]))
        m = m.view(m.shape[0], n, block_k).any(dim=2)  # (nq|1, nk)
    return m


def expand_block_mask(block_mask: Tensor, block_q: int, block_k: int, n_q: int, n_k: int) -> Tensor:
    """A ``(nq, nk)`` tile mask as the equivalent element mask ``(n_q, n_k)``."""
    rows = block_mask.repeat_interleave(block_q, dim=0)[:n_q]
    return rows.repeat_interleave(block_k, dim=1)[:, :n_k]


def _causal_tiles(n_q: int, n_k: int, b: int, device) -> Tensor:
    """Tiles with at least one key at or before a query (bottom-right aligned), ``(nq, nk)``."""
    nq, nk = -(-n_q // b), -(-n_k // b)
    last_q = torch.clamp(torch.arange(1, nq + 1, device=device) * b, max=n_q) - 1 + (n_k - n_q)
    first_k = torch.arange(nk, device=device) * b
    return first_k[None, :] <= last_q[:, None]


def _as_block_mask(block_mask: Any, nq: int, nk: int, b: int) -> Tensor:
    bm = torch.as_tensor(block_mask)
    if bm.dtype != torch.bool or bm.dim() != 2 or tuple(bm.shape) != (nq, nk):
        raise ValueError(
            f"block_mask must be a boolean (⌈Tq/b⌉, ⌈Tk/b⌉) = {(nq, nk)} tile mask for "
            f"block_size={b}, got {tuple(bm.shape)} {bm.dtype}"
        )
    return bm


# ----------------------------------------------------------------------------------------------
# the backend


def check_block_sparse_options(options: dict[str, Any], dropout_p: float = 0.0) -> None:
    """Validate the ``block_sparse`` options that do not depend on the sequence (config time;
    :func:`~attnlab.attention.core.check_backend` has refused dropout before).

    Raises:
        ValueError: an unknown pattern, a missing or bad option.
    """
    opts = dict(options)
    positive_int_option("block_sparse", "block_size", opts.pop("block_size", DEFAULT_BLOCK_SIZE))
    block_mask = opts.pop("block_mask", None)
    pattern = opts.pop("pattern", None)
    if block_mask is not None:
        torch.as_tensor(block_mask)  # must at least be array-like
    if pattern is not None:
        opts = _pattern_options(pattern, opts)
        _check_global_tokens(opts.get("global_tokens", ()), None)
        if pattern == "longformer":
            positive_int_option("block_sparse", "window", opts["window"])
        else:
            _check_bigbird_counts(opts["window_blocks"], opts["random_blocks"], opts["seed"])
    elif any(v is not None for v in opts.values()):
        raise ValueError(
            f"backend 'block_sparse': options {sorted(opts)} belong to a pattern; "
            f"set pattern to one of {sorted(PATTERNS)}"
        )


def block_sparse_attention(
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
    pattern: str | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    **pattern_options: Any,
) -> tuple[Tensor, Tensor | None]:
    """Exact attention under a sparse mask, computing only the tiles that hold an allowed entry.

    The allowed set is ``mask ∧ pattern ∧ block_mask ∧ causal``; tiles of ``block_size ×
    block_size`` scores with no allowed entry are skipped in the forward and the backward pass.

    Args:
        q, k, v: as for :func:`attnlab.attention.scaled_dot_product_attention` (GQA allowed).
        mask: boolean, broadcastable to ``(..., H, Tq, Tk)``; True = may attend.
        bias: additive scores (ALiBi, T5), with gradient.
        is_causal: bottom-right aligned causal constraint.
        scale: score scale.
        dropout_p: must be 0.
        return_weights: also return the ``(..., H, Tq, Tk)`` weights (computed by ``math`` with
            the same allowed set; O(N²), only when asked, e.g. by a capture).
        pattern: ``longformer`` | ``bigbird`` | None (only ``mask``/``block_mask``).
        block_size: tile size b (and BigBird's block).
        **pattern_options: ``block_mask``: boolean ``(⌈Tq/b⌉, ⌈Tk/b⌉)``, the tiles to compute
            in full (others are masked); the pattern's options (:data:`PATTERN_OPTIONS`):
            ``window``, Longformer's window (keys with ``|p − j| < window``);
            ``global_tokens``, positions that see and are seen by every token;
            ``window_blocks``, ``random_blocks``, ``seed``: BigBird's neighbouring blocks per side
            (default 1), random blocks per query block (default 2) and their seed (default 0).

    Returns:
        ``(out (..., H, Tq, Dv), weights or None)``.

    Raises:
        ValueError: an unknown pattern, a global token index outside the sequence, bad sizes.
    """
    b = positive_int_option("block_sparse", "block_size", block_size)
    Tq, Tk = q.shape[-2], k.shape[-2]
    block_mask = pattern_options.pop("block_mask", None)
    unknown = sorted(set(pattern_options) - set(PATTERN_OPTIONS))
    if unknown:
        raise ValueError(f"backend 'block_sparse' does not take option(s) {unknown}")
    pat = None
    if pattern is not None:
        causal = is_causal or Tq < Tk
        pat = pattern_mask(
            pattern, Tq, Tk, causal=causal, block_size=b, device=q.device, **pattern_options
        )
    elif any(x is not None for x in pattern_options.values()):
        raise ValueError(
            f"backend 'block_sparse': window/global_tokens/... belong to a pattern; set pattern "
            f"to one of {sorted(PATTERNS)}"
        )
    nq, nk = -(-Tq // b), -(-Tk // b)
    blocks = None if block_mask is None else _as_block_mask(block_mask, nq, nk, b).to(q.device)
    allowed = combine_masks(mask, pat)  # exact element mask inside the live tiles

    if return_weights:
        full = allowed
        if blocks is not None:
            full = combine_masks(full, expand_block_mask(blocks, b, b, Tq, Tk))
        return scaled_dot_product_attention(
            q,
            k,
            v,
            mask=full,
            bias=bias,
            is_causal=is_causal,
            scale=scale,
            backend="math",
            return_weights=True,
        )

    live = torch.ones(nq, nk, dtype=torch.bool, device=q.device)
    if allowed is not None:
        reduced = allowed
        while reduced.dim() > 2:  # a tile is live if any batch row or head needs it
            reduced = reduced.any(dim=0)
        while reduced.dim() < 2:
            reduced = reduced.unsqueeze(0)
        live = live & tile_mask(reduced, b, b)
    if blocks is not None:
        live = live & blocks
    if is_causal:
        live = live & _causal_tiles(Tq, Tk, b, q.device)
    live_rows = [torch.nonzero(row).flatten().tolist() for row in live.cpu()]
    out = tiled_forward(q, k, v, allowed, bias, is_causal, scale, b, b, live_rows)
    return out, None


register_backend(
    "block_sparse",
    block_sparse_attention,
    returns_weights=True,
    dropout=False,
    check=check_block_sparse_options,
    options=("pattern", "block_size", "block_mask", *PATTERN_OPTIONS),
)
