"""The Transformer's layers around attention, top to bottom as in nanoGPT's ``model.py``: the
norms, the position-wise feed-forward networks, the absolute position tables the stack's input
adds, and the block that wires attention and the FFN with residuals.

**Norms.** LayerNorm, RMSNorm and (for the ablation that shows why Transformers do not use it)
BatchNorm::

    LayerNorm(x) = (x − mean(x)) / √(var(x) + ε) · γ + β
    RMSNorm(x)   = x / √(mean(x²) + ε) · γ          (ε inside the square root)
    BatchNorm(x) = (x − μ) / √(σ² + ε) · γ + β      μ, σ² per feature over every token of the batch

LayerNorm's and RMSNorm's statistics are over the last dimension C of each token, BatchNorm's over
all the leading dimensions (batch × time) of each feature.

**Feed-forward networks.** The same weights act on every position, ``(..., C) -> (..., C)``::

    MLP(x)      = act(x W₁ + b₁) W₂ + b₂                  (hidden = 4·d_model by default)
    GatedFFN(x) = (act(x W₁) ⊙ x W₂) W₃                   (Shazeer 2020, "GLU variants")
    SwiGLU(x)   = GatedFFN with act = SiLU                 (Llama's FFN); GEGLU: act = GELU (T5 1.1)

**Absolute positions.** A vector per position added to the token embeddings (the other position
schemes, RoPE, ALiBi, T5's buckets, act inside attention: :mod:`attnlab.layers.position`)::

    Sinusoidal (Vaswani et al.): PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d))
    Learned: one trained vector per position (GPT-2's ``wpe``)

(The table itself, :func:`attnlab.layers.position.sinusoidal_table`, sits with the position
interface: ViT's 2-D grids and the Universal Transformer's step code read it too.)

**The block.** Attention and FFN sub-layers with residuals, pre- or post-norm::

    post-norm (Vaswani 2017):  x = Norm(x + Sublayer(x))
    pre-norm  (GPT-2 onward):  x = x + Sublayer(Norm(x))
    without residuals (an ablation, ``residual=False``): Norm(Sublayer(x)), Sublayer(Norm(x))

One block serves encoders (self-attention), decoders (causal self-attention, optional
cross-attention to an encoder's output) and vision models (Swin wraps it in window partitioning);
the model wrappers add embeddings, masks and heads. Parts a block lacks (cross-attention,
drop-path) are ``nn.Identity`` placeholders, so ``forward`` has no branches on them. The block
takes ready parts; :func:`attnlab.layers.builders.build_block` builds them from the fields of a
:class:`attnlab.config.BlockConfig`.

Shape legend: B batch, T time, S context length, C d_model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from attnlab.layers.drop_path import DropPath
from attnlab.layers.hook import HookPoint, hooks_active
from attnlab.layers.position.base import Positions, sinusoidal_table

if TYPE_CHECKING:  # annotations only: attention imports this package, so no import at run time
    from attnlab.attention.cache import KVCache
    from attnlab.attention.multihead import MultiHeadAttention

__all__ = [
    "LayerNorm",
    "RMSNorm",
    "BatchNorm",
    "make_norm",
    "NormName",
    "MLP",
    "GatedFFN",
    "SwiGLU",
    "ACTIVATIONS",
    "activation_fn",
    "Activation",
    "SinusoidalPositionalEmbedding",
    "LearnedPositionalEmbedding",
    "TransformerBlock",
    "run_blocks",
    "NormPosition",
]

NormName = Literal["layernorm", "rmsnorm", "batchnorm"]
Activation = Literal["relu", "gelu", "gelu_tanh", "silu", "relu2", "quick_gelu"]
NormPosition = Literal["pre", "post"]


# Norms --------------------------------------------------------------------------------------------


class LayerNorm(nn.Module):
    """Layer normalisation with an optional bias (GPT-2 style models drop it).

    Args:
        dim: the normalised (last) dimension.
        eps: added to the variance.
        bias: learn β as well as γ.
    """

    def __init__(
        self, dim: int, *, eps: float = 1e-5, bias: bool = True, device=None, dtype=None
    ) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(dim, device=device, dtype=dtype)) if bias else None
        # hook points: the scale σ = √(var + ε) (..., 1) and (x − mean) / σ (..., D), before γ, β
        self.hook_scale, self.hook_normalized = HookPoint(), HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        if hooks_active(self.hook_scale, self.hook_normalized):  # the formula, step by step
            x = x - x.mean(dim=-1, keepdim=True)
            scale = self.hook_scale((x.pow(2).mean(dim=-1, keepdim=True) + self.eps).sqrt())
            x = self.hook_normalized(x / scale)
            return x * self.weight if self.bias is None else x * self.weight + self.bias
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, bias={self.bias is not None}"


class RMSNorm(nn.Module):
    """Root-mean-square normalisation: ``x / √(mean(x²) + ε) · γ``, no centring, no bias.

    Computed in fp32 and cast back, as Llama does, so bf16 activations keep their precision.

    Args:
        dim: the normalised (last) dimension.
        eps: added to the mean square, inside the square root.
    """

    def __init__(self, dim: int, *, eps: float = 1e-6, device=None, dtype=None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))
        # hook points: the scale √(mean(x²) + ε) (..., 1) and x / scale (..., D), before γ
        self.hook_scale, self.hook_normalized = HookPoint(), HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        if hooks_active(self.hook_scale, self.hook_normalized):
            scale = self.hook_scale((xf.pow(2).mean(dim=-1, keepdim=True) + self.eps).sqrt())
            return self.weight * self.hook_normalized(xf / scale).to(x.dtype)
        xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class BatchNorm(nn.Module):
    """Batch normalisation of token features: each of the D features is normalised by its mean
    and variance over every token of the batch (all leading dimensions, batch × time), as
    ``nn.BatchNorm1d`` on ``x.reshape(-1, D)``.

    In training mode the statistics are the batch's, so a token's output depends on the other
    tokens in the batch, padding and (in a causal model) later positions included; in evaluation
    mode the running averages (``momentum``) are used and tokens are independent again.

    Args:
        dim: the feature dimension D (last).
        eps: added to the variance.
        bias: learn β as well as γ.
        momentum: the running averages' update rate.
    """

    def __init__(
        self,
        dim: int,
        *,
        eps: float = 1e-5,
        bias: bool = True,
        momentum: float = 0.1,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(dim, device=device, dtype=dtype)) if bias else None
        self.register_buffer("running_mean", torch.zeros(dim, device=device, dtype=dtype))
        self.register_buffer("running_var", torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])  # (N, D), N = every token of the batch
        if self.training and flat.shape[0] < 2:
            raise ValueError(
                "BatchNorm in training mode needs at least 2 tokens per batch (its statistics are "
                "over batch × time); call .eval() to use the running statistics"
            )
        out = F.batch_norm(
            flat,
            self.running_mean,
            self.running_var,
            self.weight,
            self.bias,
            training=self.training,
            momentum=self.momentum,
            eps=self.eps,
        )
        return out.view_as(x)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, bias={self.bias is not None}"


def make_norm(
    name: str, dim: int, *, eps: float = 1e-5, bias: bool = True, device=None, dtype=None
) -> nn.Module:
    """Build a norm by name: ``layernorm`` | ``rmsnorm`` | ``batchnorm`` (``bias`` is ignored by
    RMSNorm)."""
    if name == "layernorm":
        return LayerNorm(dim, eps=eps, bias=bias, device=device, dtype=dtype)
    if name == "rmsnorm":
        return RMSNorm(dim, eps=eps, device=device, dtype=dtype)
    if name == "batchnorm":
        return BatchNorm(dim, eps=eps, bias=bias, device=device, dtype=dtype)
    raise ValueError(f"unknown norm {name!r}; choose 'layernorm', 'rmsnorm' or 'batchnorm'")


# Feed-forward networks ----------------------------------------------------------------------------


ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's "gelu_new"
    "silu": F.silu,
    "relu2": lambda x: F.relu(x).square(),  # ReLU² (So et al. 2021, Primer; modded-nanogpt)
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),  # CLIP's x·σ(1.702x)
}


def activation_fn(name: str):
    """The activation called ``name`` (one of :data:`ACTIVATIONS`).

    Raises:
        ValueError: an unknown name.
    """
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; choose from {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


class MLP(nn.Module):
    """Two linear layers with an activation between them.

    Args:
        d_model: input and output width.
        hidden: inner width (default ``4 * d_model``).
        activation: ``relu`` | ``gelu`` | ``gelu_tanh`` | ``silu`` | ``relu2`` (ReLU²) |
            ``quick_gelu`` (CLIP).
        bias: use biases in both layers.
        dropout: dropout on the output.
    """

    def __init__(
        self,
        d_model: int,
        hidden: int | None = None,
        *,
        activation: str = "gelu_tanh",
        bias: bool = True,
        dropout: float = 0.0,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        hidden = 4 * d_model if hidden is None else hidden
        self.fc1 = nn.Linear(d_model, hidden, bias=bias, device=device, dtype=dtype)
        self.fc2 = nn.Linear(hidden, d_model, bias=bias, device=device, dtype=dtype)
        self.act = activation_fn(activation)
        self.activation = activation
        self.dropout = nn.Dropout(dropout)
        self.hook_pre, self.hook_post = HookPoint(), HookPoint()  # (..., hidden): before/after act

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.fc2(self.hook_post(self.act(self.hook_pre(self.fc1(x))))))


class GatedFFN(nn.Module):
    """Gated FFN ``(act(x W₁) ⊙ x W₂) W₃``: one linear map gates another, element by element.

    The lecture's W₁, W₂, W₃ are ``gate``, ``up`` and ``down`` here (HF Llama's gate_proj, up_proj,
    down_proj; HF T5's wi_0, wi_1, wo; Meta's w1, w3, w2).

    Args:
        d_model: input and output width.
        hidden: inner width (default ≈ 8/3 · d_model, so the parameters match a 4× MLP).
        activation: the gate's ``relu`` | ``gelu`` | ``gelu_tanh`` (GEGLU, T5 1.1) | ``silu``.
        bias: use biases.
        dropout: dropout on the output.
    """

    def __init__(
        self,
        d_model: int,
        hidden: int | None = None,
        *,
        activation: str = "gelu_tanh",
        bias: bool = True,
        dropout: float = 0.0,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        hidden = _swiglu_hidden(d_model) if hidden is None else hidden
        self.gate = nn.Linear(d_model, hidden, bias=bias, device=device, dtype=dtype)
        self.up = nn.Linear(d_model, hidden, bias=bias, device=device, dtype=dtype)
        self.down = nn.Linear(hidden, d_model, bias=bias, device=device, dtype=dtype)
        self.act = activation_fn(activation)
        self.activation = activation
        self.dropout = nn.Dropout(dropout)
        # hook points (..., hidden): x W₁ (gate), x W₂ (up), and act(x W₁) ⊙ x W₂ (the neurons)
        self.hook_pre, self.hook_pre_linear, self.hook_post = HookPoint(), HookPoint(), HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        gated = self.act(self.hook_pre(self.gate(x))) * self.hook_pre_linear(self.up(x))
        return self.dropout(self.down(self.hook_post(gated)))


class SwiGLU(GatedFFN):
    """Gated FFN ``(SiLU(x W₁) ⊙ x W₂) W₃`` (Llama's): :class:`GatedFFN` gated by SiLU.

    Args:
        d_model: input and output width.
        hidden: inner width (Llama uses about 8/3 · d_model so parameters match a 4× MLP).
        bias: use biases (Llama does not).
        dropout: dropout on the output.
    """

    def __init__(
        self,
        d_model: int,
        hidden: int | None = None,
        *,
        bias: bool = False,
        dropout: float = 0.0,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(
            d_model,
            hidden,
            activation="silu",
            bias=bias,
            dropout=dropout,
            device=device,
            dtype=dtype,
        )


def _swiglu_hidden(d_model: int, multiple_of: int = 8) -> int:
    h = int(8 * d_model / 3)
    return multiple_of * ((h + multiple_of - 1) // multiple_of)


# Absolute positions -------------------------------------------------------------------------------


class SinusoidalPositionalEmbedding(Positions):
    """Fixed sinusoidal positions; ``forward(positions) -> (..., dim)``, ``embed`` adds them."""

    absolute = True

    def __init__(self, max_seq_len: int, dim: int, *, base: float = 10000.0) -> None:
        super().__init__()
        self.max_seq_len = max_seq_len
        self.register_buffer(
            "table", sinusoidal_table(max_seq_len, dim, base=base), persistent=False
        )
        self.hook_pos_embed = HookPoint()  # the added positions, (B, T, D)

    def forward(self, positions: Tensor) -> Tensor:
        _check_positions(positions, self.max_seq_len)
        return self.table[positions]

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return x + self.hook_pos_embed(self(positions).to(x.dtype).expand_as(x))


class LearnedPositionalEmbedding(Positions):
    """A trained vector per position (GPT-2 ``wpe``); ``forward(positions) -> (..., dim)``."""

    absolute = True

    def __init__(self, max_seq_len: int, dim: int, *, device=None, dtype=None) -> None:
        super().__init__()
        self.max_seq_len = max_seq_len
        self.weight = nn.Parameter(torch.zeros(max_seq_len, dim, device=device, dtype=dtype))
        nn.init.normal_(self.weight, std=0.02)
        self.hook_pos_embed = HookPoint()  # the added positions, (B, T, D)

    def forward(self, positions: Tensor) -> Tensor:
        _check_positions(positions, self.max_seq_len)
        return self.weight[positions]

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return x + self.hook_pos_embed(self(positions).expand_as(x))


def _check_positions(positions: Tensor, max_seq_len: int) -> None:
    if torch.compiler.is_compiling():
        return  # reading the maximum would split a compiled graph; eager calls check
    if positions.numel() and int(positions.max()) >= max_seq_len:
        raise ValueError(f"position {int(positions.max())} is beyond max_seq_len={max_seq_len}")


# The block ----------------------------------------------------------------------------------------


class TransformerBlock(nn.Module):
    """Self-attention, optional cross-attention, and a feed-forward sub-layer.

    Args:
        attn: self-attention module (a :class:`MultiHeadAttention`).
        ffn: position-wise FFN (``MLP``, ``SwiGLU`` or ``MoE``), or None for an attention-only
            block (no FFN sub-layer: ``ffn`` and ``norm2`` are ``nn.Identity``).
        norm1, norm2: norms around the attention and FFN sub-layers.
        cross_attn, norm_cross: cross-attention and its norm (decoders of encoder–decoders).
        norm_position: ``pre`` or ``post``.
        residual: add each sub-layer's input back (False: the skip connections removed,
            ``x ← F(Norm(x))`` pre-norm, ``x ← Norm(F(x))`` post-norm; an ablation).
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
        residual: bool = True,
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
        self.norm_position, self.residual = norm_position, residual
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
        if not self.residual:  # the ablation: no skip connection
            out = self.drop_path(
                self.dropout(sublayer(norm(x) if self.norm_position == "pre" else x))
            )
            return out if self.norm_position == "pre" else norm(out)
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
        pos_emb: Positions | None = None,
        value_embed: Tensor | None = None,
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
            pos_emb: the model's shared relative position module (RoPE, ALiBi, T5), applied in
                self-attention.
            value_embed: ``(B, T, Hkv·D)`` added to the self-attention's values (the LM's value
                embeddings; see :class:`~attnlab.attention.MultiHeadAttention`).

        Attention weights are not kept: read them with :func:`attnlab.attention.capture_attention`.
        """

        def self_attention(h: Tensor) -> Tensor:
            kw = {"positions": positions, "bias": attn_bias, "cache": cache, "pos_emb": pos_emb}
            if value_embed is not None:  # (only then: other attention classes lack the argument)
                kw["value_embed"] = value_embed
            return self.hook_attn_out(self.attn(h, mask=mask, is_causal=is_causal, **kw)[0])

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
