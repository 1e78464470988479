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
from attnlab.attention.core import (
    attention_scores,
    backend_for_weights,
    repeat_kv,
    scaled_dot_product_attention,
)
from attnlab.attention.linformer import LinformerProjection
from attnlab.layers.hook import (
    HookPoint,
    capturing_attention,
    capturing_scores,
    hooks_active,
    report_attention,
)
from attnlab.layers.position import Positions

__all__ = ["MultiHeadAttention", "PositionName"]

PositionName = Literal["none", "rope", "alibi", "t5"]


def _out_width(part: nn.Module, name: str) -> int:
    """Output width of a projection (``out_features``, or the rows of its ``weight``)."""
    width = getattr(part, "out_features", None)
    if width is None and getattr(part, "weight", None) is not None:
        width = part.weight.shape[0]
    if width is None:
        raise ValueError(f"{name} needs out_features or a weight (N, K) to read its width from")
    return int(width)


def _in_width(part: nn.Module) -> int | None:
    width = getattr(part, "in_features", None)
    if width is None and getattr(part, "weight", None) is not None:
        width = part.weight.shape[-1]
    return None if width is None else int(width)


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention over ready parts.

    Self-attention takes ``qkv`` (one projection C -> (H + 2·Hkv)·D: queries, keys, values);
    cross-attention ``q_proj`` (C -> H·D) and ``kv_proj`` (context width -> 2·Hkv·D). The head
    width D is ``out_proj``'s input width / H; the key/value heads Hkv follow from the widths.
    :func:`attnlab.attention.build_attention` builds the parts from a config's fields.

    Args:
        n_heads: query heads H.
        out_proj: the output projection H·D -> C.
        qkv: self-attention's fused Q | K | V projection.
        q_proj, kv_proj: cross-attention's projections (queries from x, keys | values from the
            context).
        positions: a relative position module (RoPE, ALiBi, T5) this layer owns; a module shared
            by the layers of a model is owned by the model and passed to :meth:`forward` as
            ``pos_emb`` instead.
        qk_norm: ``(q_norm, k_norm)``, per-head norms of q and k (QK-norm); default none.
        scale: multiplies the scores ``q·k`` (default ``1/√D``; T5 uses 1, its initialisation
            folds the scale into W_Q).
        dropout: dropout on the attention weights (training only).
        backend, backend_options: the attention backend and its options (see
            :func:`attnlab.attention.scaled_dot_product_attention`).
        linformer: a :class:`~attnlab.attention.linformer.LinformerProjection` of keys and values
            along the sequence (non-causal self-attention without a position bias or a cache).

    Weights: while :func:`attnlab.attention.capture_attention` is open (or ``need_weights``), the
    layer computes explicit weights and reports them; it never keeps them.

    Raises:
        ValueError: widths or head counts that do not fit together.
    """

    def __init__(
        self,
        n_heads: int,
        out_proj: nn.Module,
        *,
        qkv: nn.Module | None = None,
        q_proj: nn.Module | None = None,
        kv_proj: nn.Module | None = None,
        positions: Positions | None = None,
        qk_norm: tuple[nn.Module, nn.Module] | None = None,
        scale: float | None = None,
        dropout: float = 0.0,
        backend: str = "auto",
        backend_options: dict | None = None,
        linformer: LinformerProjection | None = None,
    ) -> None:
        super().__init__()
        self.cross = qkv is None
        given = (q_proj is not None, kv_proj is not None)
        if given != ((True, True) if self.cross else (False, False)):
            raise ValueError("give qkv (self-attention) or q_proj and kv_proj (cross-attention)")
        q_width = _in_width(out_proj) or 0
        if n_heads < 1 or q_width % n_heads != 0:
            raise ValueError(f"out_proj's input width ({q_width}) must be n_heads ({n_heads}) x D")
        D = q_width // n_heads
        kv_width = (
            _out_width(kv_proj, "kv_proj") if self.cross else _out_width(qkv, "qkv") - q_width
        )
        if kv_width % (2 * D) != 0 or kv_width == 0 or n_heads % (kv_width // (2 * D)) != 0:
            raise ValueError(
                f"keys and values of width {kv_width} must be 2 x Hkv x D (D={D}) with Hkv "
                f"dividing n_heads ({n_heads})"
            )
        if self.cross and _out_width(q_proj, "q_proj") != q_width:
            raise ValueError(f"q_proj must map to n_heads x D = {q_width}")
        if self.cross and positions is not None and positions.relative:
            raise ValueError(
                "cross-attention takes no relative positions (position must be 'none')"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"attention dropout must be in [0, 1), got {dropout}")
        if linformer is not None and (
            self.cross or (positions is not None and positions.relative and _adds_bias(positions))
        ):
            raise ValueError(
                "Linformer (linformer_k) is for self-attention without a score per (query, key) "
                "distance (projected keys have no position): use rope, learned, sinusoidal or none"
            )
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, kv_width // (2 * D), D
        self.d_model = _out_width(out_proj, "out_proj")
        source = kv_proj if self.cross else qkv
        self.context_dim = _in_width(source) or self.d_model
        self.dropout, self.backend = dropout, backend
        self.backend_options = dict(backend_options or {})
        if self.cross:
            self.q_proj, self.kv_proj = q_proj, kv_proj  # K | V
        else:
            self.qkv = qkv  # Q | K | V
        self.out_proj = out_proj
        q_norm, k_norm = qk_norm if qk_norm is not None else (nn.Identity(), nn.Identity())
        self.q_norm, self.k_norm = q_norm, k_norm
        self.scale = scale
        # relative schemes (RoPE, ALiBi, T5...) act here; absolute ones are the model's business
        self.positions = positions if positions is not None and positions.relative else None
        self.linformer = linformer
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
        pos_emb: Positions | None = None,
        value_embed: Tensor | None = None,
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
            pos_emb: the model's shared relative position module (RoPE, ALiBi, T5), when this
                layer owns none.
            value_embed: ``(B, T, Hkv·D)`` added to this step's values before they are cached
                and attended (self-attention; the LM's value embeddings, ``v ← v + value_embed``).

        Returns:
            ``(out (B, T, C), weights or None)``.
        """
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (B, T, d_model={self.d_model}), got {tuple(x.shape)}")
        B, T, _ = x.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        if self.cross:
            if value_embed is not None:
                raise ValueError("value_embed is for self-attention (cross-attention got it)")
            q, k, v = self._cross_qkv(x, context, cache)
        else:
            if context is not None:
                raise ValueError(
                    "self-attention takes no context; cross-attention is built with q_proj and kv_proj "
                    "(build_attention(config, cross=True))"
                )
            q, k, v = self.qkv(x).split([H * D, Hkv * D, Hkv * D], dim=-1)
            q = self.q_norm(self.hook_q(q.view(B, T, H, D)).transpose(1, 2))  # (B, H, T, D)
            k = self.k_norm(self.hook_k(k.view(B, T, Hkv, D)).transpose(1, 2))  # (B, Hkv, T, D)
            if value_embed is not None:
                v = v + value_embed  # (B, T, Hkv·D)
            v = self.hook_v(v.view(B, T, Hkv, D)).transpose(1, 2)  # (B, Hkv, T, D)
            pe = self.positions if self.positions is not None else pos_emb
            pe = pe if pe is not None and pe.relative else None  # absolute: the model's embedding
            if pe is not None and positions is None:
                past = 0 if cache is None else cache.length
                positions = torch.arange(past, past + T, device=x.device)
            if pe is not None:
                q, k = pe.rotate(q, k, positions, positions)  # RoPE; the others: unchanged
            if self.linformer is not None:
                k, v, mask = self._project_sequence(k, v, mask, is_causal, cache, bias)
                is_causal = False
            if cache is not None:
                k, v = cache.update(k, v)  # (B, Hkv, past + T, D)
            if pe is not None:
                bias = self._position_bias(pe, positions, k.shape[-2], cache, bias)
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
            scale=self.scale,
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
                scores = attention_scores(
                    q, k, mask=mask, is_causal=is_causal, scale=self.scale, bias=bias
                )
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
        scores = attention_scores(
            q, k, mask=mask, is_causal=is_causal, scale=self.scale, bias=bias
        )  # (B, H, T, S)
        scores = self.hook_attn_scores(scores)
        empty = torch.isneginf(scores).all(dim=-1, keepdim=True)  # a row with no allowed key
        weights = scores.masked_fill(empty, 0.0).softmax(dim=-1).masked_fill(empty, 0.0)
        weights = self.hook_pattern(weights)
        if capturing_attention():
            report_attention(self, weights, scores if capturing_scores() else None)
        attn = F.dropout(weights, p=self.dropout) if self.training and self.dropout else weights
        return attn @ repeat_kv(v, self.n_heads // v.shape[-3]), weights  # (B, H, T, D)

    def _cross_qkv(
        self, x: Tensor, context: Tensor | None, cache: KVCache | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Cross-attention's ``q (B, H, T, D)`` from x and ``k, v (B, Hkv, S, D)`` from the
        context, or from a filled cache."""
        B, T, _ = x.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        q = self.q_norm(self.hook_q(self.q_proj(x).view(B, T, H, D)).transpose(1, 2))  # (B,H,T,D)
        if cache is not None and cache.length > 0:
            k, v = cache.get()
            return q, k, v
        if context is None:
            raise ValueError("cross-attention needs a context (B, S, context_dim)")
        if context.dim() != 3 or context.shape[0] != B or context.shape[-1] != self.context_dim:
            raise ValueError(
                f"context must be (B={B}, S, context_dim={self.context_dim}), "
                f"got {tuple(context.shape)}"
            )
        k, v = self.kv_proj(context).split(Hkv * D, dim=-1)
        k = self.k_norm(self.hook_k(k.view(B, -1, Hkv, D)).transpose(1, 2))  # (B, Hkv, S, D)
        v = self.hook_v(v.view(B, -1, Hkv, D)).transpose(1, 2)  # (B, Hkv, S, D)
        if cache is not None:
            k, v = cache.update(k, v)
        return q, k, v

    def _position_bias(
        self,
        pe: Positions,
        positions: Tensor,
        S: int,
        cache: KVCache | None,
        bias: Tensor | None,
    ) -> Tensor | None:
        """``bias`` plus the position scheme's score per (query, key) pair (ALiBi, T5)."""
        # the newest key is this step's last query, so key j sits at position
        # last_query_pos - (newest - j); left padding shifts keys and queries alike
        newest = S - 1 if cache is None else cache.newest_slot()  # static: the cursor
        last = positions[..., -1:]  # (1,) or (B, 1)
        k_pos = torch.arange(S, device=positions.device) - newest + last  # (S,) or (B, S)
        pos_bias = pe.bias(positions, k_pos)  # (H, T, S) | (B, H, T, S)
        if pos_bias is None:
            return bias
        return pos_bias if bias is None else bias + pos_bias

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


def _adds_bias(positions: Positions) -> bool:
    probe = torch.zeros(1)
    return positions.bias(probe, probe) is not None
