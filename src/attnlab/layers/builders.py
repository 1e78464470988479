"""Builders: the one place where a config's values meet the modules.

The modules of :mod:`attnlab.attention` and :mod:`attnlab.layers` take ready parts
(:class:`~attnlab.attention.MultiHeadAttention` its projections, norms and position module;
:class:`~attnlab.layers.block.TransformerBlock` its attention, FFN and norms). The functions here
read the fields of a :class:`attnlab.config.BlockConfig` (or a family config that embeds it: any
object with those attributes, so this layer does not import the config layer) and build them:

    build_positions(config)       the model's position module, shared by its layers
    build_attention(config)       projections, QK-norm, Linformer -> MultiHeadAttention
    build_ffn(config)             MLP | SwiGLU | MoE
    build_block(config)           attention + FFN + norms -> TransformerBlock
    build_final_norm(config)      the norm after a pre-norm stack

Shape legend: C d_model, H heads, Hkv key/value heads, D head_dim.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from attnlab.attention.core import check_backend
from attnlab.attention.linformer import LinformerProjection
from attnlab.attention.multihead import MultiHeadAttention
from attnlab.layers.block import (
    MLP,
    GatedFFN,
    LearnedPositionalEmbedding,
    SinusoidalPositionalEmbedding,
    SwiGLU,
    TransformerBlock,
    make_norm,
)
from attnlab.layers.moe import MoE
from attnlab.layers.position import (
    POSITION_KINDS,
    ALiBi,
    NoPositions,
    Positions,
    RotaryEmbedding,
    T5RelativeBias,
)

__all__ = [
    "POSITION_KINDS",
    "build_attention",
    "build_block",
    "build_ffn",
    "build_final_norm",
    "build_positions",
]


def build_positions(
    config: Any,
    *,
    causal: bool = False,
    max_seq_len: int | None = None,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> Positions:
    """The position module for ``config.position`` (one per model, shared by its layers).

    Reads ``position``, ``d_model``, ``n_heads``, ``head_dim`` (None: ``d_model // n_heads``),
    ``max_seq_len`` and ``rope_theta``; each scheme needs only some (tables their length and
    width, RoPE the head width, ALiBi the head count).

    Args:
        config: a :class:`attnlab.config.BlockConfig`, a family config, or any object with those
            fields (``types.SimpleNamespace(position="rope", head_dim=16, ...)``).
        causal: the model's self-attention is causal: T5's table then has buckets only for
            earlier keys (T5's decoder); otherwise for both sides (T5's encoder).
        max_seq_len: the table length, for a config that names its length otherwise.
        num_buckets, max_distance: T5's bucketing (32 and 128 in T5).

    Raises:
        ValueError: an unknown name, or bad T5 bucket settings.
    """
    c = config
    kind = c.position
    n = getattr(c, "max_seq_len", None) if max_seq_len is None else max_seq_len
    if kind == "none":
        return NoPositions()
    if kind == "learned":
        return LearnedPositionalEmbedding(n, c.d_model)
    if kind == "sinusoidal":
        return SinusoidalPositionalEmbedding(n, c.d_model)
    if kind == "rope":
        head_dim = getattr(c, "head_dim", None) or c.d_model // c.n_heads
        return RotaryEmbedding(head_dim, theta=getattr(c, "rope_theta", 10000.0))
    if kind == "alibi":
        return ALiBi(c.n_heads)
    if kind == "t5":
        return T5RelativeBias(
            c.n_heads, num_buckets=num_buckets, max_distance=max_distance, bidirectional=not causal
        )
    raise ValueError(f"unknown position {kind!r}; choose from {list(POSITION_KINDS)}")


def build_attention(
    config: Any,
    *,
    cross: bool = False,
    context_dim: int | None = None,
    shared_positions: bool = False,
    max_seq_len: int | None = None,
    device=None,
    dtype=None,
) -> MultiHeadAttention:
    """A :class:`MultiHeadAttention` from a config's attention fields.

    Reads ``d_model``, ``n_heads``, ``n_kv_heads``, ``head_dim``, ``bias``, ``qk_norm``,
    ``qk_norm_eps``, ``attn_scale``, ``attn_dropout``, ``position``, ``rope_theta``,
    ``backend``, ``backend_options`` and ``linformer_k``.

    Args:
        config: a :class:`attnlab.config.BlockConfig` or anything with its fields.
        cross: cross-attention to a context of width ``context_dim`` (default ``d_model``).
        shared_positions: the model owns the (relative) position module and passes it to every
            call (``pos_emb=``); otherwise a relative scheme (``rope``, ``alibi``, ``t5``) is
            built for this layer.
        max_seq_len: the sequence length N Linformer's ``linformer_k`` needs (default the
            config's ``max_seq_len``).

    Raises:
        ValueError: widths or head counts that do not fit, a backend that cannot run with its
            options.
    """
    c = config
    kw = {"device": device, "dtype": dtype}
    H = c.n_heads
    Hkv = c.n_kv_heads or H
    if c.head_dim is None and c.d_model % H != 0:
        raise ValueError(f"d_model ({c.d_model}) must be divisible by n_heads ({H})")
    if H % Hkv != 0:
        raise ValueError(f"n_heads ({H}) must be divisible by n_kv_heads ({Hkv})")
    D = c.head_dim or c.d_model // H
    backend_options = dict(c.backend_options or {})
    check_backend(c.backend, backend_options, dropout_p=c.attn_dropout)
    norms = {}
    if c.qk_norm is not None:
        norms["qk_norm"] = tuple(make_norm(c.qk_norm, D, eps=c.qk_norm_eps, **kw) for _ in "qk")
    out_proj = nn.Linear(H * D, c.d_model, bias=c.bias, **kw)
    common = dict(
        scale=getattr(c, "attn_scale", None),
        dropout=c.attn_dropout,
        backend=c.backend,
        backend_options=backend_options,
    )
    linformer_k = getattr(c, "linformer_k", None)
    if cross:
        if linformer_k is not None:
            raise ValueError("linformer_k is for self-attention, not cross-attention")
        if c.position in ("rope", "alibi", "t5") and not shared_positions:
            raise ValueError(
                "cross-attention takes no relative positions (position must be 'none')"
            )
        width = c.d_model if context_dim is None else context_dim
        return MultiHeadAttention(
            H,
            out_proj,
            q_proj=nn.Linear(c.d_model, H * D, bias=c.bias, **kw),
            kv_proj=nn.Linear(width, 2 * Hkv * D, bias=c.bias, **kw),  # K | V
            **norms,
            **common,
        )
    if context_dim is not None and context_dim != c.d_model:
        raise ValueError("context_dim is for cross-attention (cross=True)")
    positions = None
    if c.position in ("rope", "alibi", "t5") and not shared_positions:
        positions = build_positions(c)
    linformer = None
    if linformer_k is not None:
        n = getattr(c, "max_seq_len", None) if max_seq_len is None else max_seq_len
        if n is None:
            raise ValueError(f"linformer_k={linformer_k} needs the sequence length N: max_seq_len")
        linformer = LinformerProjection(linformer_k, n, **kw)
    return MultiHeadAttention(
        H,
        out_proj,
        qkv=nn.Linear(c.d_model, (H + 2 * Hkv) * D, bias=c.bias, **kw),  # Q | K | V
        positions=positions,
        linformer=linformer,
        **norms,
        **common,
    )


def build_ffn(config: Any, *, device=None, dtype=None) -> nn.Module | None:
    """The position-wise FFN named by ``config.ffn``: ``mlp`` | ``swiglu`` | ``gated`` (a GLU
    variant gated by ``activation``: GEGLU with ``gelu_tanh``, T5 1.1's) | ``moe``, or None for
    ``none`` (an attention-only block); reads ``d_model``, ``ffn_hidden``, ``activation``,
    ``bias``, ``n_experts``, ``top_k``.

    Raises:
        ValueError: an unknown FFN.
    """
    c = config
    kw = {"device": device, "dtype": dtype}
    if c.ffn == "mlp":
        return MLP(c.d_model, c.ffn_hidden, activation=c.activation, bias=c.bias, **kw)
    if c.ffn == "swiglu":
        return SwiGLU(c.d_model, c.ffn_hidden, bias=c.bias, **kw)
    if c.ffn == "gated":
        return GatedFFN(c.d_model, c.ffn_hidden, activation=c.activation, bias=c.bias, **kw)
    if c.ffn == "moe":
        return MoE(
            c.d_model,
            c.ffn_hidden or 4 * c.d_model,
            c.n_experts,
            c.top_k,
            expert="swiglu" if c.activation == "silu" else "mlp",
            activation=c.activation,
            **kw,
        )
    if c.ffn == "none":
        return None
    raise ValueError(f"unknown ffn {c.ffn!r}; choose 'mlp', 'swiglu', 'gated', 'moe' or 'none'")


def build_block(
    config: Any,
    *,
    cross_attention: bool = False,
    context_dim: int | None = None,
    shared_positions: bool = False,
    drop_path: float | None = None,
    max_seq_len: int | None = None,
    device=None,
    dtype=None,
) -> TransformerBlock:
    """A :class:`TransformerBlock` from the block fields of a config (a
    :class:`attnlab.config.BlockConfig` or a family config that embeds it).

    Args:
        config: the config (``BlockConfig(d_model=64, n_heads=4, ffn="swiglu")`` for one block).
        cross_attention, context_dim: add cross-attention to a context of this width.
        shared_positions: the model owns one relative position module and passes it to the
            blocks' calls (``pos_emb=``); otherwise each block's attention builds its own.
        drop_path: this block's stochastic-depth rate (default: the config's ``drop_path``).
        max_seq_len: the longest sequence N (Linformer's ``linformer_k`` needs it; default the
            config's ``max_seq_len`` if it has one).

    Raises:
        ValueError: unknown component names, a backend that cannot run with its options.
    """
    c = config
    kw = {"device": device, "dtype": dtype}
    if c.norm_position not in ("pre", "post"):
        raise ValueError(f"norm_position must be 'pre' or 'post', got {c.norm_position!r}")
    attn = build_attention(c, shared_positions=shared_positions, max_seq_len=max_seq_len, **kw)
    ffn = build_ffn(c, **kw)
    cross = norm_cross = None
    if cross_attention:
        cross = build_attention(c, cross=True, context_dim=context_dim, shared_positions=True, **kw)
        norm_cross = make_norm(c.norm, c.d_model, eps=c.norm_eps, bias=c.bias, **kw)
    return TransformerBlock(
        attn,
        ffn,
        make_norm(c.norm, c.d_model, eps=c.norm_eps, bias=c.bias, **kw),
        make_norm(c.norm, c.d_model, eps=c.norm_eps, bias=c.bias, **kw),
        cross_attn=cross,
        norm_cross=norm_cross,
        norm_position=c.norm_position,
        residual=c.residual,
        dropout=c.dropout,
        drop_path=c.drop_path if drop_path is None else drop_path,
    )


def build_final_norm(config: Any, enabled: bool | None = None) -> nn.Module:
    """The norm after the last block of a stack, from a config's ``norm`` fields.

    A pre-norm stack needs one: its residual stream is never normalised otherwise. Post-norm
    blocks end normalised, so by default they get none.

    Args:
        config: a :class:`attnlab.config.BlockConfig` (or anything with its norm fields).
        enabled: whether the stack has a final norm (default: ``norm_position == "pre"``).

    Returns:
        ``make_norm(config.norm, d_model, ...)``, or ``nn.Identity()`` when not ``enabled``.
    """
    c = config
    if enabled is None:
        enabled = c.norm_position == "pre"
    if not enabled:
        return nn.Identity()
    return make_norm(c.norm, c.d_model, eps=c.norm_eps, bias=c.bias)
