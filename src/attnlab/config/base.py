"""The one config system: every model, task and training config is a dataclass built on ``Config``.

A config is plain data (JSON in a run directory, TOML/YAML on the command line), so it chooses
components by name (``norm: Literal["layernorm", "rmsnorm"]``) and never holds a class or a module.
The base class gives every config the same behaviour:

- types are checked from the annotations when it is built: ``int``, ``float``, ``bool``, ``str``,
  ``Literal[...]`` (the choices), ``X | None``, ``list``/``tuple``/``dict`` and nested configs; a
  wrong value raises :class:`ConfigError` naming the field, what it must be and what it got;
- ``validate()`` (overridden per config) derives defaults and checks values that must fit together;
  it never builds or runs a model;
- ``to_dict()`` / ``from_dict()`` round-trip through JSON; an unknown key raises
  :class:`ConfigError` naming it and the valid keys; keys renamed since an earlier release are
  mapped through ``RENAMED``;
- presets are data: ``PRESETS = {name: {field: value}}`` and ``preset(name, **overrides)``.

Below the base: ``BlockConfig``, everything a Transformer block needs, embedded in every
Transformer family. The LM, the seq2seq Transformer, ViT, Swin, the captioner and VQA configs all
inherit these fields, so each family gets grouped-query attention, RoPE/ALiBi, QK-norm, SwiGLU,
mixture of experts, drop-path and every attention backend without new code:
:func:`attnlab.layers.builders.build_block` reads them; ``config.block`` is the plain
``BlockConfig`` part. ``TextStackConfig`` adds what a stack over token ids needs.

    @dataclass
    class ViTConfig(BlockConfig):
        PRESETS: ClassVar[dict] = {"tiny": dict(image_size=8, patch_size=2, d_model=64)}
        image_size: int = 224
        ...
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

from attnlab.errors import UserError, did_you_mean

__all__ = [
    "Config",
    "ConfigError",
    "BlockConfig",
    "TextStackConfig",
    "swiglu_hidden",
    "FFNKind",
    "NormKind",
    "NormPosition",
    "PositionKind",
    "Activation",
]

C = TypeVar("C", bound="Config")


class ConfigError(UserError):
    """A config value of the wrong type, out of range, or an unknown key or preset."""


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _describe(tp: Any) -> str:
    origin = get_origin(tp)
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        parts = [_describe(a) for a in get_args(tp) if a is not type(None)]
        return " or ".join(parts) + (" or null" if type(None) in get_args(tp) else "")
    if origin in (list, tuple) or tp in (list, tuple):
        return "a list"
    if origin is dict or tp is dict:
        return "a mapping"
    if isinstance(tp, type) and issubclass(tp, Config):
        return f"a mapping of {tp.__name__} fields"
    return str(tp)


def _literal_choices(tp: Any) -> list | None:
    """The allowed values of a ``Literal[...]`` annotation (``None`` included when optional)."""
    if get_origin(tp) is Literal:
        return list(get_args(tp))
    if get_origin(tp) in (Union, types.UnionType):
        lits = [a for arg in get_args(tp) if get_origin(arg) is Literal for a in get_args(arg)]
        if lits:
            return ([None] if type(None) in get_args(tp) else []) + lits
    return None


class _Mismatch(Exception):
    pass


def _coerce(value: Any, tp: Any) -> Any:
    """``value`` as type ``tp`` (lists for tuples, dicts for nested configs) or raise _Mismatch."""
    if tp is Any:
        return value
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise _Mismatch
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg)
            except _Mismatch:
                continue
        raise _Mismatch
    if origin is Literal:
        if any(value == a and type(value) is type(a) for a in get_args(tp)):
            return value
        raise _Mismatch
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Mismatch
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _Mismatch
    if tp is str:
        if isinstance(value, str):
            return value
        raise _Mismatch
    if origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        args = get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                raise _Mismatch
            return tuple(_coerce(v, a) for v, a in zip(value, args))
        elem = args[0] if args else Any
        items = [_coerce(v, elem) for v in value]
        return tuple(items) if (origin is tuple or tp is tuple) else items
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise _Mismatch
        return dict(value)
    if isinstance(tp, type) and issubclass(tp, Config):
        if isinstance(value, tp):
            return value
        if isinstance(value, Mapping):
            return tp.from_dict(value)
        raise _Mismatch
    return value


class Config:
    """Base of every attnlab config dataclass (see the module docstring).

    Subclasses are ``@dataclass`` classes; they override :meth:`validate`, calling
    ``super().validate()`` first, to derive and check values.
    """

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {}
    #: keys of earlier releases' config.json -> today's field names
    RENAMED: ClassVar[dict[str, str]] = {}
    #: keys accepted by ``from_dict`` and dropped: derived values recorded for people to read
    #: (token counts, dataset sizes) that a run's config.json holds next to the settings
    IGNORED: ClassVar[frozenset[str]] = frozenset()

    def __post_init__(self) -> None:
        self.check_types()
        self.validate()

    # -- checks ---------------------------------------------------------------------------------

    def check_types(self) -> None:
        """Check (and normalise: int -> float, list -> tuple) every field against its annotation.

        Raises:
            ConfigError: naming the field, what it must be and the value it got.
        """
        hints = _hints(type(self))
        for f in dataclasses.fields(self):
            if not f.init:
                continue
            tp, value = hints[f.name], getattr(self, f.name)
            try:
                setattr(self, f.name, _coerce(value, tp))
            except _Mismatch:
                choices = _literal_choices(tp)
                if choices:
                    hint = did_you_mean(value, map(str, choices)) if isinstance(value, str) else ""
                    raise ConfigError(
                        f"unknown {f.name} {value!r}{hint}; choose from {choices}"
                    ) from None
                raise ConfigError(f"{f.name} must be {_describe(tp)}, got {value!r}") from None

    def validate(self) -> None:
        """Derive defaults and check values that must fit together (override; call super)."""

    def positive(self, *names: str, allow_zero: bool = False) -> None:
        """Raise :class:`ConfigError` for the first field of ``names`` that is not > 0 (>= 0)."""
        for name in names:
            v = getattr(self, name)
            if v is None:
                continue
            if v < 0 or (v == 0 and not allow_zero):
                want = "must be >= 0" if allow_zero else "must be positive"
                raise ConfigError(f"{name} {want}, got {v!r}")

    def fraction(self, *names: str) -> None:
        """Raise :class:`ConfigError` for the first field of ``names`` outside [0, 1)."""
        for name in names:
            v = getattr(self, name)
            if not 0.0 <= v < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {v!r}")

    # -- serialisation --------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of every field (derived values filled in)."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self) if f.init}

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.init]

    @classmethod
    def from_dict(cls: type[C], d: Mapping[str, Any]) -> C:
        """Inverse of :meth:`to_dict`.

        Raises:
            ConfigError: ``d`` is not a mapping, has an unknown key (named, with the valid ones),
                or a value that does not fit.
        """
        if not isinstance(d, Mapping):
            raise ConfigError(f"{cls.__name__} needs a mapping of fields, got {type(d).__name__}")
        d = {cls.RENAMED.get(k, k): v for k, v in d.items() if k not in cls.IGNORED}
        names = cls.field_names()
        unknown = sorted(set(d) - set(names))
        if unknown:
            hints = [did_you_mean(k, names) for k in unknown]
            hint = f" {' '.join(h.strip() for h in hints if h)}" if any(hints) else ""
            raise ConfigError(
                f"unknown {cls.__name__} field(s) {unknown}{hint}; valid fields: {', '.join(names)}"
            )
        return cls(**d)

    @classmethod
    def presets(cls) -> list[str]:
        """Names of the presets of this config class."""
        return sorted(cls.PRESETS)

    @classmethod
    def preset(cls: type[C], name: str, **overrides: Any) -> C:
        """A named preset with fields overridden.

        Raises:
            ConfigError: unknown preset (the message lists the known ones) or field.
        """
        if name not in cls.PRESETS:
            raise ConfigError(
                f"unknown {cls.__name__} preset {name!r}{did_you_mean(name, cls.presets())}; "
                f"choose from {cls.presets()}"
            )
        return cls.from_dict({**cls.PRESETS[name], **overrides})

    def replace(self: C, **changes: Any) -> C:
        """A copy with ``changes`` applied and validated again."""
        return type(self).from_dict({**self.to_dict(), **changes})


def _plain(v: Any) -> Any:
    if isinstance(v, Config):
        return v.to_dict()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


# The block's fields, embedded in every Transformer family -----------------------------------------

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
