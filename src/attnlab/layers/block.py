"""The Transformer block: attention and FFN sub-layers with residuals, pre- or post-norm.

    post-norm (Vaswani 2017):  x = Norm(x + Sublayer(x))
    pre-norm  (GPT-2 onward):  x = x + Sublayer(Norm(x))

One block serves encoders (self-attention), decoders (causal self-attention, optional
cross-attention to an encoder's output) and vision models; the model wrappers add embeddings, masks
and heads. Parts a block lacks (cross-attention) are ``nn.Identity`` placeholders.

Shape legend: B batch, T time, S context length, C d_model.
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor, nn

from attnlab.attention.cache import KVCache
from attnlab.attention.multihead import MultiHeadAttention
from attnlab.layers.ffn import MLP, SwiGLU
from attnlab.layers.moe import MoE
from attnlab.layers.norm import make_norm

__all__ = ["TransformerBlock", "build_block", "NormPosition"]

NormPosition = Literal["pre", "post"]


class TransformerBlock(nn.Module):
    """Self-attention, optional cross-attention, and a feed-forward sub-layer.

    Args:
        attn: self-attention module (a :class:`MultiHeadAttention`).
        ffn: position-wise FFN (``MLP``, ``SwiGLU`` or ``MoE``).
        norm1, norm2: norms around the attention and FFN sub-layers.
        cross_attn, norm_cross: cross-attention and its norm (decoders of encoder–decoders).
        norm_position: ``pre`` or ``post``.
        dropout: residual dropout on each sub-layer's output.
    """

    def __init__(
        self,
        attn: MultiHeadAttention,
        ffn: nn.Module,
        norm1: nn.Module,
        norm2: nn.Module,
        *,
        cross_attn: MultiHeadAttention | None = None,
        norm_cross: nn.Module | None = None,
        norm_position: str = "pre",
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if norm_position not in ("pre", "post"):
            raise ValueError(f"norm_position must be 'pre' or 'post', got {norm_position!r}")
        if (cross_attn is None) != (norm_cross is None):
            raise ValueError("cross_attn and norm_cross go together")
        self.attn, self.ffn, self.norm1, self.norm2 = attn, ffn, norm1, norm2
        self.has_cross = cross_attn is not None
        self.cross_attn = cross_attn if cross_attn is not None else nn.Identity()
        self.norm_cross = norm_cross if norm_cross is not None else nn.Identity()
        self.norm_position = norm_position
        self.dropout = nn.Dropout(dropout)
        self.attn_weights: Tensor | None = None  # filled when need_weights=True
        self.cross_weights: Tensor | None = None

    def _residual(self, x: Tensor, norm: nn.Module, sublayer) -> Tensor:
        if self.norm_position == "pre":
            return x + self.dropout(sublayer(norm(x)))
        return norm(x + self.dropout(sublayer(x)))

    def forward(
        self,
        x: Tensor,
        *,
        mask: Tensor | None = None,
        is_causal: bool = False,
        positions: Tensor | None = None,
        cache: KVCache | None = None,
        context: Tensor | None = None,
        context_mask: Tensor | None = None,
        cross_cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> Tensor:
        """``x (B, T, C) -> (B, T, C)``.

        Args:
            mask: self-attention mask broadcastable to ``(B, H, T, T_total)``; True = may attend.
            is_causal: causal self-attention.
            positions: query positions for RoPE/ALiBi.
            cache: self-attention KV cache.
            context: encoder output ``(B, S, C_ctx)`` for cross-attention.
            context_mask: cross-attention mask broadcastable to ``(B, H, T, S)``.
            cross_cache: cache of the context's keys/values.
            need_weights: keep this call's attention weights in ``attn_weights`` / ``cross_weights``.
        """

        def self_attention(h: Tensor) -> Tensor:
            out, w = self.attn(
                h,
                mask=mask,
                is_causal=is_causal,
                positions=positions,
                cache=cache,
                need_weights=need_weights,
            )
            self.attn_weights = w
            return out

        x = self._residual(x, self.norm1, self_attention)
        if self.has_cross:
            if context is None and (cross_cache is None or cross_cache.length == 0):
                raise ValueError("this block has cross-attention: pass context=(B, S, C)")

            def cross_attention(h: Tensor) -> Tensor:
                out, w = self.cross_attn(
                    h, context, mask=context_mask, cache=cross_cache, need_weights=need_weights
                )
                self.cross_weights = w
                return out

            x = self._residual(x, self.norm_cross, cross_attention)
        return self._residual(x, self.norm2, self.ffn)


def build_block(
    d_model: int,
    n_heads: int,
    *,
    n_kv_heads: int | None = None,
    head_dim: int | None = None,
    ffn: str = "mlp",
    ffn_hidden: int | None = None,
    activation: str = "gelu",
    n_experts: int = 8,
    top_k: int = 2,
    norm: str = "layernorm",
    norm_eps: float = 1e-5,
    norm_position: str = "pre",
    bias: bool = True,
    qk_norm: str | None = None,
    position: str = "none",
    rope_theta: float = 10000.0,
    dropout: float = 0.0,
    attn_dropout: float = 0.0,
    cross_attention: bool = False,
    context_dim: int | None = None,
    backend: str = "auto",
    backend_options: dict | None = None,
    device=None,
    dtype=None,
) -> TransformerBlock:
    """Assemble a :class:`TransformerBlock` from named components.

    Model builders call this with values read from their config; ``ffn`` is ``mlp`` | ``swiglu`` |
    ``moe``, ``norm`` is ``layernorm`` | ``rmsnorm``, ``position`` is ``none`` | ``rope`` | ``alibi``.
    """
    kw = {"device": device, "dtype": dtype}
    attn_kw = dict(
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        bias=bias,
        qk_norm=qk_norm,
        dropout=attn_dropout,
        backend=backend,
        backend_options=backend_options,
        **kw,
    )
    attn = MultiHeadAttention(d_model, n_heads, position=position, rope_theta=rope_theta, **attn_kw)
    if ffn == "mlp":
        ffn_mod: nn.Module = MLP(d_model, ffn_hidden, activation=activation, bias=bias, **kw)
    elif ffn == "swiglu":
        ffn_mod = SwiGLU(d_model, ffn_hidden, bias=bias, **kw)
    elif ffn == "moe":
        ffn_mod = MoE(
            d_model,
            ffn_hidden or 4 * d_model,
            n_experts,
            top_k,
            expert="swiglu" if activation == "silu" else "mlp",
            activation=activation,
            **kw,
        )
    else:
        raise ValueError(f"unknown ffn {ffn!r}; choose 'mlp', 'swiglu' or 'moe'")

    def make() -> nn.Module:
        return make_norm(norm, d_model, eps=norm_eps, bias=bias, **kw)

    cross = norm_cross = None
    if cross_attention:
        cross = MultiHeadAttention(d_model, n_heads, cross=True, context_dim=context_dim, **attn_kw)
        norm_cross = make()
    return TransformerBlock(
        attn,
        ffn_mod,
        make(),
        make(),
        cross_attn=cross,
        norm_cross=norm_cross,
        norm_position=norm_position,
        dropout=dropout,
    )
