"""``BlockConfig``: everything a Transformer block needs, embedded in every Transformer family.

The LM, the seq2seq Transformer, ViT, Swin, the captioner and VQA configs all inherit these
fields, so each family gets grouped-query attention, RoPE/ALiBi, QK-norm, SwiGLU, mixture of
experts, drop-path and every attention backend without new code: ``build_block(config)`` in
:mod:`attnlab.layers.block` reads them. ``config.block`` is the plain ``BlockConfig`` part.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from attnlab.config.base import Config, ConfigError

__all__ = [
    "BlockConfig",
    "TextStackConfig",
    "swiglu_hidden",
    "FFNKind",
    "NormKind",
    "NormPosition",
    "PositionKind",
    "Activation",
]

FFNKind = Literal["mlp", "swiglu", "gated", "moe", "none"]
NormKind = Literal["layernorm", "rmsnorm", "batchnorm"]
NormPosition = Literal["pre", "post"]
Activation = Literal["gelu_tanh", "gelu", "relu", "silu", "relu2", "quick_gelu"]
#: 1-D position schemes (vision families narrow or extend this in their own configs)
PositionKind = Literal["learned", "sinusoidal", "rope", "alibi", "t5", "none"]


def swiglu_hidden(d_model: int, multiple_of: int = 8) -> int:
    """Llama's rule: 2/3 of a 4·d MLP, so a gated FFN (three matrices) has the MLP's parameters."""
    h = int(8 * d_model / 3)
    return multiple_of * ((h + multiple_of - 1) // multiple_of)


@dataclass
class BlockConfig(Config):
    """The fields of one Transformer block (see :func:`attnlab.layers.builders.build_block`).

    Attributes:
        d_model: residual width C.
        n_heads: query heads H.
        n_kv_heads: key/value heads (None = n_heads; fewer = grouped-query attention, 1 = MQA).
        head_dim: per-head width (None = d_model // n_heads).
        ffn: ``mlp`` | ``swiglu`` | ``gated`` (``(act(x W₁) ⊙ x W₂) W₃`` with ``activation``: GEGLU
            for ``gelu_tanh``, T5 1.1's) | ``moe`` | ``none`` (attention-only blocks, as in the
            induction-head models of Olsson et al. 2022).
        ffn_hidden: inner width (None = 4·d for mlp, ≈ 8/3·d for gated FFNs).
        activation: MLP activation (``relu2``: ReLU², ``relu(x)²``, as in Primer and
            modded-nanogpt); MoE experts are SwiGLU when ``silu``.
        n_experts, top_k, moe_aux_coef: mixture of experts (``ffn == "moe"``).
        norm, norm_eps, norm_position: ``layernorm`` | ``rmsnorm`` | ``batchnorm`` (statistics of
            each feature over batch × time: the ablation of ``attnlab experiment ablations``), its
            ε, ``pre`` | ``post``.
        residual: the skip connections around each sub-layer (False: ``x ← F(Norm(x))`` pre-norm,
            ``x ← Norm(F(x))`` post-norm; the ablation of ``attnlab experiment ablations``).
        position: how order enters (``learned`` | ``sinusoidal`` | ``rope`` | ``alibi`` | ``t5`` |
            ``none``); ``t5`` is one bucketed relative-bias table shared by all layers.
        rope_theta: RoPE's base θ.
        qk_norm: normalise q and k per head (None | ``rmsnorm`` | ``layernorm``).
        qk_norm_eps: the QK-norm's ε.
        attn_scale: multiplies the scores q·k (None = 1/√head_dim; T5 uses 1.0: its
            initialisation folds the scale into W_Q).
        bias: biases in the linear layers and LayerNorms.
        dropout: residual and embedding dropout. attn_dropout: on the attention weights.
        drop_path: stochastic depth: the largest rate, reached by the last block (linear in depth).
        backend, backend_options: attention backend (see ``scaled_dot_product_attention``), e.g.
            ``block_sparse`` with ``{"pattern": "longformer", "window": 32, "global_tokens": [0]}``.
        linformer_k: Linformer: project keys and values along the sequence to this many rows
            (None = full attention); the sequence length N is the family's maximum length.
            Non-causal (encoder) attention only.
    """

    d_model: int = 64
    n_heads: int = 4
    n_kv_heads: int | None = None
    head_dim: int | None = None
    ffn: FFNKind = "mlp"
    ffn_hidden: int | None = None
    activation: Activation = "gelu_tanh"
    n_experts: int = 8
    top_k: int = 2
    moe_aux_coef: float = 0.01
    norm: NormKind = "layernorm"
    norm_eps: float = 1e-5
    norm_position: NormPosition = "pre"
    residual: bool = True
    position: PositionKind = "learned"
    rope_theta: float = 10000.0
    qk_norm: NormKind | None = None
    qk_norm_eps: float = 1e-6
    attn_scale: float | None = None
    bias: bool = True
    dropout: float = 0.0
    attn_dropout: float = 0.0
    drop_path: float = 0.0
    backend: str = "auto"
    backend_options: dict[str, Any] = field(default_factory=dict)
    linformer_k: int | None = None

    def validate(self) -> None:
        super().validate()
        self.positive("d_model", "n_heads", "n_experts", "top_k")
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads != 0:
            raise ConfigError(
                f"n_heads ({self.n_heads}) must be a positive multiple of n_kv_heads "
                f"({self.n_kv_heads})"
            )
        if self.head_dim is None:
            if self.d_model % self.n_heads != 0:
                raise ConfigError(
                    f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}), "
                    "or set head_dim"
                )
            self.head_dim = self.d_model // self.n_heads
        self.positive("head_dim")
        if self.position == "rope" and self.head_dim % 2 != 0:
            raise ConfigError(f"RoPE needs an even head_dim, got {self.head_dim}")
        if self.position == "sinusoidal" and self.d_model % 2 != 0:
            raise ConfigError(f"sinusoidal positions need an even d_model, got {self.d_model}")
        if self.ffn_hidden is None:
            gated = self.ffn in ("swiglu", "gated") or (
                self.ffn == "moe" and self.activation == "silu"
            )
            self.ffn_hidden = swiglu_hidden(self.d_model) if gated else 4 * self.d_model
        self.positive("ffn_hidden")
        if self.ffn == "moe" and not 1 <= self.top_k <= self.n_experts:
            raise ConfigError(
                f"top_k ({self.top_k}) must be between 1 and n_experts ({self.n_experts})"
            )
        self.positive("moe_aux_coef", allow_zero=True)
        if self.qk_norm == "batchnorm":
            raise ConfigError(
                "qk_norm='batchnorm' is not supported: q and k are normalised per head and token "
                "(None, 'rmsnorm' or 'layernorm')"
            )
        self.positive("norm_eps", "qk_norm_eps", "rope_theta", "attn_scale")
        self.fraction("dropout", "attn_dropout", "drop_path")
        if self.linformer_k is not None:
            self.positive("linformer_k")
            n = getattr(self, "max_seq_len", None)
            if isinstance(n, int) and self.linformer_k > n:
                raise ConfigError(
                    f"linformer_k ({self.linformer_k}) must not exceed the sequence length "
                    f"max_seq_len ({n})"
                )
            if self.position in ("alibi", "t5"):
                raise ConfigError(
                    f"linformer_k does not work with position={self.position!r} (a bias per "
                    "query-key distance; projected keys have no position): use rope, learned, "
                    "sinusoidal or none"
                )

    @property
    def block(self) -> BlockConfig:
        """The plain :class:`BlockConfig` part of this (family) config.

        A family's own position schemes (ViT's 2-D grids, Swin's window table) live outside the
        blocks' attention and appear here as ``none``.
        """
        d = self.block_fields()
        if d["position"] not in typing.get_args(PositionKind):
            d["position"] = "none"
        return BlockConfig(**d)

    def block_fields(self) -> dict[str, Any]:
        """The block fields as a dict (what ``build_block`` reads)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(BlockConfig)}


@dataclass
class TextStackConfig(BlockConfig):
    """The block fields plus what a stack of blocks over token ids adds: the decoder-only LM's
    :class:`~attnlab.config.ModelConfig` and the encoder's
    :class:`~attnlab.config.EncoderConfig` inherit it.

    Attributes:
        vocab_size: V.
        max_seq_len: the context length; learned position tables have this many rows.
        n_layers: L blocks.
        tie_embeddings: the output projection shares the token embedding matrix.
        init_std: standard deviation of the normal initialisation.
    """

    vocab_size: int = 256
    max_seq_len: int = 128
    n_layers: int = 2
    tie_embeddings: bool = True
    init_std: float = 0.02

    def validate(self) -> None:
        super().validate()
        self.positive("vocab_size", "max_seq_len", "n_layers", "init_std")
