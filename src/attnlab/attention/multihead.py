"""Multi-head attention: self or cross, grouped-query, QK-norm, positions, KV cache.

    head_i = Attention(X W_Qⁱ, C W_Kⁱ, C W_Vⁱ),   MHA(X, C) = Concat(head_1 … head_H) W_O

with C = X for self-attention. All heads are computed by one batched matmul per projection, never a
loop. Grouped-query attention (GQA) gives the H query heads only Hkv key/value heads, each shared
by H/Hkv query heads (Hkv = 1 is multi-query attention, MQA).

Shape legend: B batch, T query length, S key/value (context) length, C model width d_model,
H query heads, Hkv key/value heads, D head_dim.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.attention.cache import KVCache
from attnlab.attention.capture import capturing_attention, capturing_scores, report_attention
from attnlab.attention.core import (
    attention_scores,
    backend_for_weights,
    repeat_kv,
    scaled_dot_product_attention,
)
from attnlab.attention.linformer import LinformerProjection
from attnlab.layers.hook import HookPoint, hooks_active
from attnlab.layers.matvec import Linear
from attnlab.layers.norm import make_norm
from attnlab.layers.position import (
    ALiBi,
    NoPositions,
    Positions,
    RotaryEmbedding,
    T5RelativeBias,
)

__all__ = ["MultiHeadAttention", "PositionName"]

PositionName = Literal["none", "rope", "alibi", "t5"]


def _attention_positions(position: str | Positions, head_dim: int, n_heads: int, theta: float):
    if isinstance(position, Positions):
        return position
    if position == "rope":
        return RotaryEmbedding(head_dim, theta=theta)
    if position == "alibi":
        return ALiBi(n_heads)
    if position == "t5":
        return T5RelativeBias(n_heads)
    if position == "none":
        return NoPositions()
    raise ValueError(f"unknown position {position!r}; choose 'none', 'rope', 'alibi' or 't5'")


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention.

    Args:
        d_model: width C of the queries' input (and of the output).
        n_heads: number of query heads H.
        n_kv_heads: key/value heads Hkv (default H; 1 = MQA; H must be a multiple).
        head_dim: per-head width D (default ``d_model // n_heads``).
        cross: cross-attention: queries from x, keys/values from a separate ``context``.
        context_dim: width of the context (cross-attention only; default ``d_model``).
        bias: biases in the Q/K/V projections.
        out_bias: bias in the output projection (default: same as ``bias``).
        qk_norm: ``None`` | ``"rmsnorm"`` | ``"layernorm"``: normalise q and k per head.
        qk_norm_eps: ε of the QK-norm.
        dropout: dropout on the attention weights (training only).
        position: ``none`` | ``rope`` | ``alibi`` | ``t5`` (this layer's own module, registered
            here), or a :class:`~attnlab.layers.position.Positions` module shared with other
            layers (its ``rotate`` and ``bias`` act here). A shared module is kept as a plain
            reference, not a submodule: the model that owns it registers it once, so its
            parameters (T5's table) appear once in the state dict and move with the model.
        rope_theta: RoPE's base θ.
        backend: attention backend (see :func:`attnlab.attention.scaled_dot_product_attention`).
        backend_options: extra options for the backend (``block_size``, ``window``...).
        linformer_k: project keys and values along the sequence to this many rows (Linformer,
            :class:`~attnlab.attention.linformer.LinformerProjection`); non-causal
            self-attention only, with no relative position bias and no KV cache.
        max_seq_len: N, the longest sequence (the width of Linformer's E and F).
        qkv, q_proj, kv_proj, out_proj, q_norm, k_norm: ready-made parts that replace the ones
            built from the options above (e.g. a Q/K/V projection without bias but an output
            projection with one); shapes are checked.

    Weights: while :func:`attnlab.attention.capture_attention` is open (or ``need_weights``), the
    layer computes explicit weights and reports them; it never keeps them.

    Raises:
        ValueError: widths or head counts that do not fit together.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        n_kv_heads: int | None = None,
        head_dim: int | None = None,
        cross: bool = False,
        context_dim: int | None = None,
        bias: bool = True,
        out_bias: bool | None = None,
        qk_norm: str | None = None,
        qk_norm_eps: float = 1e-6,
        dropout: float = 0.0,
        position: str | Positions = "none",
        rope_theta: float = 10000.0,
        backend: str = "auto",
        backend_options: dict | None = None,
        linformer_k: int | None = None,
        max_seq_len: int | None = None,
        qkv: nn.Module | None = None,
        q_proj: nn.Module | None = None,
        kv_proj: nn.Module | None = None,
        out_proj: nn.Module | None = None,
        q_norm: nn.Module | None = None,
        k_norm: nn.Module | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if n_heads < 1 or n_kv_heads < 1:
            raise ValueError(
                f"n_heads and n_kv_heads must be positive, got {n_heads}, {n_kv_heads}"
            )
        if head_dim is None:
            if d_model % n_heads != 0:
                raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
            head_dim = d_model // n_heads
        if n_heads % n_kv_heads != 0:
            raise ValueError(f"n_heads ({n_heads}) must be divisible by n_kv_heads ({n_kv_heads})")
        positions = _attention_positions(position, head_dim, n_heads, rope_theta)
        if cross and positions.relative:
            raise ValueError(
                "cross-attention takes no relative positions (position must be 'none')"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"attention dropout must be in [0, 1), got {dropout}")
        self.d_model, self.n_heads, self.n_kv_heads, self.head_dim = (
            d_model,
            n_heads,
            n_kv_heads,
            head_dim,
        )
        self.cross = cross
        self.position = position if isinstance(position, str) else type(position).__name__
        self.dropout = dropout
        self.backend = backend
        self.backend_options = dict(backend_options or {})
        kw = {"device": device, "dtype": dtype}
        q_width, kv_width = n_heads * head_dim, n_kv_heads * head_dim

        def part(given: nn.Module | None, name: str, n_in: int, n_out: int, b: bool) -> nn.Module:
            if given is None:
                return Linear(n_in, n_out, bias=b, **kw)  # nn.Linear; one row: matvec
            w = getattr(given, "weight", None)
            if w is not None and tuple(w.shape) != (n_out, n_in):
                raise ValueError(f"{name} must map {n_in} -> {n_out}, got weight {tuple(w.shape)}")
            return given

        if cross:
            self.context_dim = d_model if context_dim is None else context_dim
            self.q_proj = part(q_proj, "q_proj", d_model, q_width, bias)
            self.kv_proj = part(kv_proj, "kv_proj", self.context_dim, 2 * kv_width, bias)  # K | V
        else:
            if context_dim is not None and context_dim != d_model:
                raise ValueError("context_dim is for cross-attention (cross=True)")
            self.context_dim = d_model
            self.qkv = part(qkv, "qkv", d_model, q_width + 2 * kv_width, bias)  # Q | K | V
        out_b = bias if out_bias is None else out_bias
        self.out_proj = part(out_proj, "out_proj", q_width, d_model, out_b)
        if qk_norm is None:
            self.q_norm = q_norm if q_norm is not None else nn.Identity()
            self.k_norm = k_norm if k_norm is not None else nn.Identity()
        else:
            self.q_norm = q_norm or make_norm(qk_norm, head_dim, eps=qk_norm_eps, **kw)
            self.k_norm = k_norm or make_norm(qk_norm, head_dim, eps=qk_norm_eps, **kw)
        # relative schemes (RoPE, ALiBi, T5...) act here; absolute ones are the model's business
        if not positions.relative:
            self.positions = NoPositions()
        elif isinstance(position, Positions):
            # shared with other layers and owned by the model: a reference, not a submodule
            object.__setattr__(self, "positions", positions)
        else:
            self.positions = positions
        self.linformer: LinformerProjection | None = None
        if linformer_k is not None:
            if cross:
                raise ValueError("linformer_k is for self-attention, not cross-attention")
            if max_seq_len is None:
                raise ValueError(
                    f"linformer_k={linformer_k} needs the sequence length N: pass max_seq_len"
                )
            probe = torch.zeros(1)
            if positions.relative and positions.bias(probe, probe) is not None:
                raise ValueError(
                    f"Linformer (linformer_k) cannot use the position {self.position!r}: it adds "
                    "a score per (query, key) distance, and projected keys have no position; "
                    "use rope, learned, sinusoidal or none"
                )
            self.linformer = LinformerProjection(linformer_k, max_seq_len, **kw)
        # hook points (attnlab.layers.hook): q/k/v/z (B, T, H, D), scores/pattern (B, H, T, S)
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_attn_scores, self.hook_pattern, self.hook_z = (
            HookPoint(),
            HookPoint(),
            HookPoint(),
        )

    def make_cache(
        self, batch_size: int, max_seq_len: int, *, device=None, dtype=None, static: bool = False
    ) -> KVCache:
        """An empty KV cache sized for this layer (``static``: fixed shapes, see KVCache)."""
        w = self.out_proj.weight
        return KVCache(
            batch_size,
            self.n_kv_heads,
            max_seq_len,
            self.head_dim,
            device=device or w.device,
            dtype=dtype or w.dtype,
            static=static,
        )

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        is_causal: bool = False,
        positions: Tensor | None = None,
        bias: Tensor | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``x (B, T, C)`` to itself or to ``context (B, S, context_dim)``.

        Args:
            x: query input.
            context: keys/values input for cross-attention (ignored once a cross cache is filled).
            mask: boolean, broadcastable to ``(B, H, T, S)``; True = may attend. With a cache, S
                counts the cached keys too.
            is_causal: causal self-attention (bottom-right aligned with a cache).
            positions: absolute positions ``(T,)`` or ``(B, T)`` of the queries for RoPE/ALiBi;
                default ``cache.length + arange(T)``.
            bias: extra additive scores broadcastable to ``(B, H, T, S)``.
            cache: KV cache: self-attention appends this step's keys/values; cross-attention fills
                it once from ``context`` and reuses it.
            need_weights: return the attention weights ``(B, H, T, S)`` (math backend); also on
                while a capture is open.

        Returns:
            ``(out (B, T, C), weights or None)``.
        """
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (B, T, d_model={self.d_model}), got {tuple(x.shape)}")
        B, T, _ = x.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        if self.cross:
            q = self.q_proj(x)
            if cache is not None and cache.length > 0:
                k, v = cache.get()
            else:
                if context is None:
                    raise ValueError("cross-attention needs a context (B, S, context_dim)")
                if (
                    context.dim() != 3
                    or context.shape[0] != B
                    or context.shape[-1] != self.context_dim
                ):
                    raise ValueError(
                        f"context must be (B={B}, S, context_dim={self.context_dim}), "
                        f"got {tuple(context.shape)}"
                    )
                k, v = self.kv_proj(context).split(Hkv * D, dim=-1)
                k = self.hook_k(k.view(B, -1, Hkv, D)).transpose(1, 2)  # (B, Hkv, S, D)
                v = self.hook_v(v.view(B, -1, Hkv, D)).transpose(1, 2)  # (B, Hkv, S, D)
                k = self.k_norm(k)
                if cache is not None:
                    k, v = cache.update(k, v)
            q = self.q_norm(self.hook_q(q.view(B, T, H, D)).transpose(1, 2))  # (B, H, T, D)
        else:
            if context is not None:
                raise ValueError("self-attention takes no context; build with cross=True")
            q, k, v = self.qkv(x).split([H * D, Hkv * D, Hkv * D], dim=-1)
            q = self.q_norm(self.hook_q(q.view(B, T, H, D)).transpose(1, 2))  # (B, H, T, D)
            k = self.k_norm(self.hook_k(k.view(B, T, Hkv, D)).transpose(1, 2))  # (B, Hkv, T, D)
            v = self.hook_v(v.view(B, T, Hkv, D)).transpose(1, 2)  # (B, Hkv, T, D)
            relative = self.positions.relative
            if relative and positions is None:
                past = 0 if cache is None else cache.length
                positions = torch.arange(past, past + T, device=x.device)
            if relative:
                q, k = self.positions.rotate(q, k, positions, positions)
            if self.linformer is not None:
                k, v, mask = self._project_sequence(k, v, mask, is_causal, cache, bias)
                is_causal, relative = False, False
            if cache is not None:
                k, v = cache.update(k, v)  # (B, Hkv, past + T, D)
            if relative:
                S = k.shape[-2]
                # the newest key is this step's last query, so key j sits at position
                # last_query_pos - (newest - j); left padding shifts keys and queries alike
                newest = S - 1 if cache is None else cache.newest_slot()  # static: the cursor
                last = positions[..., -1:]  # (1,) or (B, 1)
                k_pos = torch.arange(S, device=x.device) - newest + last  # (S,) or (B, S)
                pos_bias = self.positions.bias(positions, k_pos)  # (H, T, S) | (B, H, T, S)
                if pos_bias is not None:
                    bias = pos_bias if bias is None else bias + pos_bias
        if hooks_active(self.hook_attn_scores, self.hook_pattern):
            out, weights = self._hooked_attention(q, k, v, mask, is_causal, bias)  # explicit path
            return self.out_proj(self.hook_z(out.transpose(1, 2)).reshape(B, T, H * D)), weights
        need_weights = need_weights or capturing_attention()
        backend, options = self.backend, self.backend_options
        if need_weights and backend_for_weights(backend) != backend:
            backend, options = backend_for_weights(backend), {}
        result = scaled_dot_product_attention(
            q,
            k,
            v,
            mask=mask,
            is_causal=is_causal,
            bias=bias,
            dropout_p=self.dropout if self.training else 0.0,
            backend=backend,
            return_weights=need_weights,
            **options,
        )
        out, weights = result if need_weights else (result, None)
        if weights is not None:
            # raw scores only when a capture asks for them (the explorer): one more Q Kᵀ
            scores = None
            if capturing_scores():
                scores = attention_scores(q, k, mask=mask, is_causal=is_causal, bias=bias)
            report_attention(self, weights, scores)
        out = self.hook_z(out.transpose(1, 2)).reshape(B, T, H * D)  # (B, T, H·D)
        return self.out_proj(out), weights

    def _hooked_attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        is_causal: bool,
        bias: Tensor | None,
    ) -> tuple[Tensor, Tensor]:
        """The math path with the scores and the pattern passing through their hook points
        (taken only while one of them has a hook): ``(out (B, H, T, D), weights (B, H, T, S))``."""
        scores = attention_scores(q, k, mask=mask, is_causal=is_causal, bias=bias)  # (B, H, T, S)
        scores = self.hook_attn_scores(scores)
        empty = torch.isneginf(scores).all(dim=-1, keepdim=True)  # a row with no allowed key
        weights = scores.masked_fill(empty, 0.0).softmax(dim=-1).masked_fill(empty, 0.0)
        weights = self.hook_pattern(weights)
        if capturing_attention():
            report_attention(self, weights, scores if capturing_scores() else None)
        attn = F.dropout(weights, p=self.dropout) if self.training and self.dropout else weights
        return attn @ repeat_kv(v, self.n_heads // v.shape[-3]), weights  # (B, H, T, D)

    def _project_sequence(
        self,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        is_causal: bool,
        cache: KVCache | None,
        bias: Tensor | None,
    ) -> tuple[Tensor, Tensor, None]:
        """Linformer: keys/values ``(B, Hkv, T, D)`` -> ``(B, Hkv, k, D)``; the key mask is
        applied before the projection (padded positions are zeroed), so none is left after it."""
        if is_causal:
            raise ValueError(
                "Linformer (linformer_k) cannot be causal: its projection mixes every position, "
                "the future included, into each projected key; use it for non-causal (encoder) "
                "attention"
            )
        if cache is not None:
            raise ValueError("Linformer (linformer_k) takes no KV cache (encoder attention only)")
        if bias is not None:
            raise ValueError(
                "Linformer (linformer_k) takes no additive score bias (attn_bias): after the "
                "projection the keys are mixtures of positions"
            )
        key_mask = None
        if mask is not None:
            B, S = k.shape[0], k.shape[-2]
            m = mask
            while m.dim() < 4:
                m = m.unsqueeze(0)
            if m.dim() > 4 or m.shape[-3] != 1 or m.shape[-2] != 1:
                raise ValueError(
                    "Linformer (linformer_k) takes only a key padding mask broadcastable to "
                    f"(B, 1, 1, S), got a mask of shape {tuple(mask.shape)}"
                )
            key_mask = m.expand(B, 1, 1, S).transpose(-1, -2)  # (B, 1, S, 1)
        k, v = self.linformer(k, v, key_mask)  # (B, Hkv, k, D)
        return k, v, None
