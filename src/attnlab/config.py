"""Configuration of decoder-only language models (GPT-2, Llama and Mixtral styles) and presets.

One dataclass describes every style: each behaviour is an explicit field chosen by name, so a
config is plain JSON in the run directory and a preset is just data. ``__post_init__`` fills the
derived values (``n_kv_heads``, ``head_dim``, ``ffn_hidden``) and rejects values that do not fit
together with a :class:`ValueError` naming them.

    ModelConfig.preset("llama-tiny", d_model=128)   # a named preset with overrides
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ModelConfig", "PRESETS"]

_FFNS = ("mlp", "swiglu", "moe")
_ACTIVATIONS = ("gelu_tanh", "gelu", "relu", "silu")
_NORMS = ("layernorm", "rmsnorm")
_POSITIONS = ("learned", "sinusoidal", "rope", "alibi", "none")


def check_field_types(
    obj: Any,
    *,
    ints: tuple[str, ...] = (),
    optional_ints: tuple[str, ...] = (),
    floats: tuple[str, ...] = (),
    bools: tuple[str, ...] = (),
) -> None:
    """Raise ``ValueError`` naming the first field whose value has the wrong type.

    Values come from JSON and ``--set KEY=VALUE``, so ``"abc"`` for a number or ``"False"`` for a
    flag must be refused here rather than fail later or, worse, count as true.
    """

    def bad(name: str, want: str) -> ValueError:
        return ValueError(f"{name} must be {want}, got {getattr(obj, name)!r}")

    for name in ints + optional_ints:
        v = getattr(obj, name)
        if not (isinstance(v, int) and not isinstance(v, bool)) and not (
            v is None and name in optional_ints
        ):
            raise bad(name, "an integer" + (" or null" if name in optional_ints else ""))
    for name in floats:
        v = getattr(obj, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise bad(name, "a number")
    for name in bools:
        if not isinstance(getattr(obj, name), bool):
            raise bad(name, "true or false")


def _swiglu_hidden(d_model: int, multiple_of: int = 8) -> int:
    # Llama's rule: 2/3 of a 4·d MLP so a gated FFN (three matrices) has the same parameter count
    h = int(8 * d_model / 3)
    return multiple_of * ((h + multiple_of - 1) // multiple_of)


@dataclass
class ModelConfig:
    """A decoder-only Transformer language model.

    Defaults are GPT-2's choices (learned positions, pre-LayerNorm, tanh-GELU MLP, biases, tied
    embeddings) at a CPU-friendly size.
    """

    vocab_size: int = 256
    max_seq_len: int = 128  # the context length; learned position tables have this many rows
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int | None = None  # None -> n_heads (multi-head); fewer -> grouped-query attention
    head_dim: int | None = None  # None -> d_model // n_heads
    ffn: str = "mlp"  # "mlp" | "swiglu" | "moe"
    ffn_hidden: int | None = None  # None -> 4·d (mlp) or ≈ 8/3·d (swiglu, silu experts)
    activation: str = "gelu_tanh"  # MLP activation; MoE experts are SwiGLU when "silu"
    n_experts: int = 8
    top_k: int = 2
    moe_aux_coef: float = 0.01  # weight of the load-balancing loss in the training loss
    norm: str = "layernorm"  # "layernorm" | "rmsnorm"
    norm_eps: float = 1e-5
    norm_position: str = "pre"  # "pre" (GPT-2 onward) | "post" (Vaswani 2017)
    position: str = "learned"  # "learned" | "sinusoidal" | "rope" | "alibi" | "none"
    rope_theta: float = 10000.0
    bias: bool = True  # biases in linear layers and LayerNorm
    qk_norm: str | None = None  # None | "rmsnorm" | "layernorm", per head on q and k
    tie_embeddings: bool = True  # the output projection shares the token embedding matrix
    dropout: float = 0.0  # embedding and residual dropout
    attn_dropout: float = 0.0  # dropout on the attention weights
    backend: str = "auto"  # attention backend (see attnlab.attention.scaled_dot_product_attention)
    backend_options: dict[str, Any] = field(default_factory=dict)
    activation_checkpointing: bool = False  # recompute each block in backward (saves memory)
    init_std: float = 0.02

    def __post_init__(self) -> None:
        check_field_types(
            self,
            ints=(
                "vocab_size",
                "max_seq_len",
                "d_model",
                "n_layers",
                "n_heads",
                "n_experts",
                "top_k",
            ),
            optional_ints=("n_kv_heads", "head_dim", "ffn_hidden"),
            floats=(
                "moe_aux_coef",
                "norm_eps",
                "rope_theta",
                "dropout",
                "attn_dropout",
                "init_std",
            ),
            bools=("bias", "tie_embeddings", "activation_checkpointing"),
        )
        for name in ("vocab_size", "max_seq_len", "d_model", "n_layers", "n_heads"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        for name, value, choices in (
            ("ffn", self.ffn, _FFNS),
            ("activation", self.activation, _ACTIVATIONS),
            ("norm", self.norm, _NORMS),
            ("norm_position", self.norm_position, ("pre", "post")),
            ("position", self.position, _POSITIONS),
            ("qk_norm", self.qk_norm, (None, *_NORMS)),
        ):
            if value not in choices:
                raise ValueError(f"unknown {name} {value!r}; choose from {list(choices)}")
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads != 0:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be a positive multiple of n_kv_heads "
                f"({self.n_kv_heads})"
            )
        if self.head_dim is None:
            if self.d_model % self.n_heads != 0:
                raise ValueError(
                    f"d_model ({self.d_model}) must be divisible by n_heads "
                    f"({self.n_heads}), or set head_dim"
                )
            self.head_dim = self.d_model // self.n_heads
        if self.head_dim < 1:
            raise ValueError(f"head_dim must be positive, got {self.head_dim}")
        if self.position == "rope" and self.head_dim % 2 != 0:
            raise ValueError(f"RoPE needs an even head_dim, got {self.head_dim}")
        if self.position == "sinusoidal" and self.d_model % 2 != 0:
            raise ValueError(f"sinusoidal positions need an even d_model, got {self.d_model}")
        if self.ffn_hidden is None:
            gated = self.ffn == "swiglu" or (self.ffn == "moe" and self.activation == "silu")
            self.ffn_hidden = _swiglu_hidden(self.d_model) if gated else 4 * self.d_model
        if self.ffn_hidden < 1:
            raise ValueError(f"ffn_hidden must be positive, got {self.ffn_hidden}")
        if self.ffn == "moe" and not 1 <= self.top_k <= self.n_experts:
            raise ValueError(
                f"top_k ({self.top_k}) must be between 1 and n_experts ({self.n_experts})"
            )
        if self.moe_aux_coef < 0:
            raise ValueError(f"moe_aux_coef must be >= 0, got {self.moe_aux_coef}")
        for name in ("dropout", "attn_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.norm_eps <= 0 or self.init_std <= 0 or self.rope_theta <= 0:
            raise ValueError(
                f"norm_eps, init_std and rope_theta must be positive, got "
                f"{self.norm_eps}, {self.init_std}, {self.rope_theta}"
            )
        if not isinstance(self.backend_options, dict):
            raise ValueError(f"backend_options must be a dict, got {self.backend_options!r}")
        from attnlab.attention.core import check_backend

        check_backend(self.backend, self.backend_options, dropout_p=self.attn_dropout)

    # -- serialisation -------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (every field, derived values filled in)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError`` naming them."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown ModelConfig field(s) {unknown}; known: {sorted(names)}")
        return cls(**d)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ModelConfig:
        """A named preset (see :data:`PRESETS`) with field overrides.

        Raises:
            ValueError: unknown preset name or field, or values that do not fit together.
        """
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
        values = {**PRESETS[name], **overrides}
        return cls.from_dict(values)


_GPT2 = dict(
    ffn="mlp",
    activation="gelu_tanh",
    norm="layernorm",
    norm_eps=1e-5,
    position="learned",
    bias=True,
    tie_embeddings=True,
)
_LLAMA = dict(
    ffn="swiglu",
    activation="silu",
    norm="rmsnorm",
    norm_eps=1e-6,
    position="rope",
    bias=False,
    tie_embeddings=False,
    rope_theta=10000.0,
)
_MIXTRAL = dict(_LLAMA, ffn="moe", norm_eps=1e-5, rope_theta=1e6, moe_aux_coef=0.01)

#: Named presets. ``tiny`` runs in CPU seconds; ``*-small`` are GPT-2-small sized (124M for gpt2).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(_GPT2, vocab_size=256, max_seq_len=128, d_model=64, n_layers=2, n_heads=4),
    "gpt2-tiny": dict(_GPT2, vocab_size=256, max_seq_len=128, d_model=64, n_layers=2, n_heads=4),
    "gpt2-mini": dict(_GPT2, vocab_size=256, max_seq_len=128, d_model=128, n_layers=4, n_heads=4),
    "gpt2-small": dict(
        _GPT2, vocab_size=50257, max_seq_len=1024, d_model=768, n_layers=12, n_heads=12
    ),
    "gpt2": dict(_GPT2, vocab_size=50257, max_seq_len=1024, d_model=768, n_layers=12, n_heads=12),
    "llama-tiny": dict(
        _LLAMA, vocab_size=256, max_seq_len=128, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2
    ),
    "llama-mini": dict(
        _LLAMA, vocab_size=256, max_seq_len=128, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2
    ),
    "llama-small": dict(
        _LLAMA,
        vocab_size=32000,
        max_seq_len=1024,
        d_model=768,
        n_layers=12,
        n_heads=12,
        n_kv_heads=4,
    ),
    "mixtral-tiny": dict(
        _MIXTRAL,
        vocab_size=256,
        max_seq_len=128,
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        n_experts=4,
        top_k=2,
        ffn_hidden=96,
    ),
    "mixtral-small": dict(
        _MIXTRAL,
        vocab_size=32000,
        max_seq_len=1024,
        d_model=512,
        n_layers=8,
        n_heads=8,
        n_kv_heads=2,
        n_experts=8,
        top_k=2,
        ffn_hidden=1024,
    ),
}
