"""The Transformer block: attention and FFN sub-layers with residuals, pre- or post-norm.

    post-norm (Vaswani 2017):  x = Norm(x + Sublayer(x))
    pre-norm  (GPT-2 onward):  x = x + Sublayer(Norm(x))

One block serves encoders (self-attention), decoders (causal self-attention, optional
cross-attention to an encoder's output) and vision models (Swin wraps it in window partitioning);
the model wrappers add embeddings, masks and heads. Parts a block lacks (cross-attention,
drop-path) are ``nn.Identity`` placeholders, so ``forward`` has no branches on them.

``build_block(config)`` reads the fields of a :class:`attnlab.config.BlockConfig` (any object with
those attributes: the building blocks do not import the config layer).

Shape legend: B batch, T time, S context length, C d_model.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from attnlab.attention.cache import KVCache
from attnlab.attention.core import check_backend
from attnlab.attention.multihead import MultiHeadAttention
from attnlab.layers.drop_path import DropPath
from attnlab.layers.ffn import MLP, SwiGLU
from attnlab.layers.hook import HookPoint
from attnlab.layers.moe import MoE
from attnlab.layers.norm import make_norm
from attnlab.layers.position import Positions

__all__ = ["TransformerBlock", "build_block", "build_final_norm", "run_blocks", "NormPosition"]

NormPosition = Literal["pre", "post"]


class TransformerBlock(nn.Module):
    """Self-attention, optional cross-attention, and a feed-forward sub-layer.

    Args:
        attn: self-attention module (a :class:`MultiHeadAttention`).
        ffn: position-wise FFN (``MLP``, ``SwiGLU`` or ``MoE``), or None for an attention-only
            block (no FFN sub-layer: ``ffn`` and ``norm2`` are ``nn.Identity``).
        norm1, norm2: norms around the attention and FFN sub-layers.
        cross_attn, norm_cross: cross-attention and its norm (decoders of encoder–decoders).
        norm_position: ``pre`` or ``post``.
        dropout: residual dropout on each sub-layer's output.
        drop_path: stochastic depth: drop each residual branch for whole samples with this rate.
    """

    def __init__(
        self,
        attn: MultiHeadAttention,
        ffn: nn.Module | None,
        norm1: nn.Module,
        norm2: nn.Module,
        *,
        cross_attn: MultiHeadAttention | None = None,
        norm_cross: nn.Module | None = None,
        norm_position: str = "pre",
        dropout: float = 0.0,
        drop_path: float = 0.0,
    ) -> None:
        super().__init__()
        if norm_position not in ("pre", "post"):
            raise ValueError(f"norm_position must be 'pre' or 'post', got {norm_position!r}")
        if (cross_attn is None) != (norm_cross is None):
            raise ValueError("cross_attn and norm_cross go together")
        self.has_ffn = ffn is not None
        if not self.has_ffn:
            ffn = norm2 = nn.Identity()
        self.attn, self.ffn, self.norm1, self.norm2 = attn, ffn, norm1, norm2
        self.has_cross = cross_attn is not None
        self.cross_attn = cross_attn if cross_attn is not None else nn.Identity()
        self.norm_cross = norm_cross if norm_cross is not None else nn.Identity()
        self.norm_position = norm_position
        self.dropout = nn.Dropout(dropout)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        # hook points (attnlab.layers.hook), all (B, T, C): the residual stream and what each
        # sub-layer adds to it
        self.hook_resid_pre, self.hook_resid_mid = HookPoint(), HookPoint()
        self.hook_attn_out, self.hook_mlp_out, self.hook_resid_post = (
            HookPoint(),
            HookPoint(),
            HookPoint(),
        )
        if self.has_cross:
            self.hook_cross_attn_out, self.hook_resid_cross = HookPoint(), HookPoint()

    def _residual(self, x: Tensor, norm: nn.Module, sublayer) -> Tensor:
        if self.norm_position == "pre":
            return x + self.drop_path(self.dropout(sublayer(norm(x))))
        return norm(x + self.drop_path(self.dropout(sublayer(x))))

    def forward(
        self,
        x: Tensor,
        *,
        mask: Tensor | None = None,
        is_causal: bool = False,
        positions: Tensor | None = None,
        attn_bias: Tensor | None = None,
        cache: KVCache | None = None,
        context: Tensor | None = None,
        context_mask: Tensor | None = None,
        cross_cache: KVCache | None = None,
    ) -> Tensor:
        """``x (B, T, C) -> (B, T, C)``.

        Args:
            mask: self-attention mask broadcastable to ``(B, H, T, T_total)``; True = may attend.
            is_causal: causal self-attention.
            positions: query positions for RoPE/ALiBi.
            attn_bias: additive self-attention scores broadcastable to ``(B, H, T, T_total)``
                (Swin's relative table, T5's bias computed once for all layers).
            cache: self-attention KV cache.
            context: encoder output ``(B, S, C_ctx)`` for cross-attention.
            context_mask: cross-attention mask broadcastable to ``(B, H, T, S)``.
            cross_cache: cache of the context's keys/values.

        Attention weights are not kept: read them with :func:`attnlab.attention.capture_attention`.
        """

        def self_attention(h: Tensor) -> Tensor:
            out, _ = self.attn(
                h, mask=mask, is_causal=is_causal, positions=positions, bias=attn_bias, cache=cache
            )
            return self.hook_attn_out(out)

        x = self.hook_resid_pre(x)
        x = self.hook_resid_mid(self._residual(x, self.norm1, self_attention))
        if self.has_cross:
            if context is None and (cross_cache is None or cross_cache.length == 0):
                raise ValueError("this block has cross-attention: pass context=(B, S, C)")

            def cross_attention(h: Tensor) -> Tensor:
                out, _ = self.cross_attn(h, context, mask=context_mask, cache=cross_cache)
                return self.hook_cross_attn_out(out)

            x = self.hook_resid_cross(self._residual(x, self.norm_cross, cross_attention))
        if not self.has_ffn:  # an attention-only block (ffn="none")
            return self.hook_resid_post(x)
        ffn = lambda h: self.hook_mlp_out(self.ffn(h))  # noqa: E731
        return self.hook_resid_post(self._residual(x, self.norm2, ffn))


_BLOCK_DEFAULTS: dict[str, Any] = dict(
    n_kv_heads=None,
    head_dim=None,
    ffn="mlp",
    ffn_hidden=None,
    activation="gelu_tanh",
    n_experts=8,
    top_k=2,
    norm="layernorm",
    norm_eps=1e-5,
    norm_position="pre",
    bias=True,
    qk_norm=None,
    qk_norm_eps=1e-6,
    position="none",
    rope_theta=10000.0,
    dropout=0.0,
    attn_dropout=0.0,
    drop_path=0.0,
    backend="auto",
    backend_options=None,
    linformer_k=None,
)


def run_blocks(
    blocks: Sequence[nn.Module],
    x: Tensor,
    *,
    caches: Sequence[KVCache] | None = None,
    cross_caches: Sequence[KVCache] | None = None,
    checkpointing: bool = False,
    **kwargs: Any,
) -> Tensor:
    """Run ``x (B, T, C)`` through a stack of blocks, block ``i`` reading ``caches[i]`` and
    ``cross_caches[i]`` (incremental decoding) and every block the same ``kwargs`` (masks,
    positions, the encoder's ``context``).

    With ``checkpointing``, a training forward pass keeps only each block's input and recomputes
    the block in the backward pass (activation checkpointing: less memory, about a third more
    compute); evaluation and no-grad passes run normally.
    """
    recompute = checkpointing and torch.is_grad_enabled() and any(b.training for b in blocks)
    for i, block in enumerate(blocks):
        if caches is not None:
            kwargs["cache"] = caches[i]
        if cross_caches is not None:
            kwargs["cross_cache"] = cross_caches[i]
        if recompute:
            x = checkpoint(block, x, use_reentrant=False, **kwargs)
        else:
            x = block(x, **kwargs)
    return x


def build_block(
    config: Any = None,
    n_heads: int | None = None,
    *,
    cross_attention: bool = False,
    context_dim: int | None = None,
    positions: Positions | None = None,
    drop_path: float | None = None,
    max_seq_len: int | None = None,
    device=None,
    dtype=None,
    **options: Any,
) -> TransformerBlock:
    """Assemble a :class:`TransformerBlock` from named components.

    Two ways to call it:

    - ``build_block(config)``: the block fields of a config (a :class:`attnlab.config.BlockConfig`
      or a family config that embeds it) — how every model builds its blocks;
    - ``build_block(d_model, n_heads, ffn=..., norm=..., position=...)``: the same fields as keywords.

    Args:
        config: the config, or ``d_model`` for the keyword form.
        n_heads: heads (keyword form only).
        cross_attention, context_dim: add cross-attention to a context of this width.
        positions: the model's shared position module; its ``rotate``/``bias`` act in attention
            (default: this block's own, built from ``position`` when that is ``rope``, ``alibi``
            or ``t5``). The model registers it once; attention keeps a reference.
        drop_path: this block's stochastic-depth rate (default: the config's ``drop_path``).
        max_seq_len: the longest sequence N (Linformer's ``linformer_k`` needs it; default the
            config's ``max_seq_len`` if it has one).
        **options: keyword form: ``ffn`` (``mlp`` | ``swiglu`` | ``moe`` | ``none``), ``ffn_hidden``,
            ``activation``, ``n_experts``, ``top_k``, ``norm`` (``layernorm`` | ``rmsnorm``),
            ``norm_eps``, ``norm_position``, ``bias``, ``qk_norm``, ``position`` (``none`` |
            ``rope`` | ``alibi`` | ``t5``), ``rope_theta``, ``dropout``, ``attn_dropout``,
            ``backend``, ``backend_options``, ``linformer_k``.

    Raises:
        ValueError: unknown component names, a backend that cannot run with its options.
    """
    if isinstance(config, int):
        if n_heads is None:
            raise ValueError("build_block(d_model, n_heads, ...): n_heads is missing")
        unknown = sorted(set(options) - set(_BLOCK_DEFAULTS))
        if unknown:
            raise ValueError(f"unknown block option(s) {unknown}; known: {sorted(_BLOCK_DEFAULTS)}")
        config = SimpleNamespace(**{**_BLOCK_DEFAULTS, **options}, d_model=config, n_heads=n_heads)
    elif options or n_heads is not None:
        raise ValueError("build_block(config) takes no other block options; change the config")
    c = config
    kw = {"device": device, "dtype": dtype}
    backend_options = dict(c.backend_options or {})
    check_backend(c.backend, backend_options, dropout_p=c.attn_dropout)
    position = positions if positions is not None else c.position
    if isinstance(position, str) and position not in ("rope", "alibi", "t5"):
        position = "none"  # absolute schemes are added to the embeddings by the model
    linformer_k = getattr(c, "linformer_k", None)
    if max_seq_len is None:
        max_seq_len = getattr(c, "max_seq_len", None)
    attn_kw = dict(
        n_kv_heads=c.n_kv_heads,
        head_dim=c.head_dim,
        bias=c.bias,
        qk_norm=c.qk_norm,
        qk_norm_eps=c.qk_norm_eps,
        dropout=c.attn_dropout,
        backend=c.backend,
        backend_options=backend_options,
        **kw,
    )
    attn = MultiHeadAttention(
        c.d_model,
        c.n_heads,
        position=position,
        rope_theta=c.rope_theta,
        linformer_k=linformer_k,
        max_seq_len=max_seq_len,
        **attn_kw,
    )
    ffn_hidden = c.ffn_hidden
    ffn_mod: nn.Module | None = None  # ffn == "none": an attention-only block
    if c.ffn == "mlp":
        ffn_mod = MLP(c.d_model, ffn_hidden, activation=c.activation, bias=c.bias, **kw)
    elif c.ffn == "swiglu":
        ffn_mod = SwiGLU(c.d_model, ffn_hidden, bias=c.bias, **kw)
    elif c.ffn == "moe":
        ffn_mod = MoE(
            c.d_model,
            ffn_hidden or 4 * c.d_model,
            c.n_experts,
            c.top_k,
            expert="swiglu" if c.activation == "silu" else "mlp",
            activation=c.activation,
            **kw,
        )
    elif c.ffn != "none":
        raise ValueError(f"unknown ffn {c.ffn!r}; choose 'mlp', 'swiglu', 'moe' or 'none'")

    def make() -> nn.Module:
        return make_norm(c.norm, c.d_model, eps=c.norm_eps, bias=c.bias, **kw)

    cross = norm_cross = None
    if cross_attention:
        cross = MultiHeadAttention(
            c.d_model, c.n_heads, cross=True, context_dim=context_dim, **attn_kw
        )
        norm_cross = make()
    return TransformerBlock(
        attn,
        ffn_mod,
        make(),
        make(),
        cross_attn=cross,
        norm_cross=norm_cross,
        norm_position=c.norm_position,
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
