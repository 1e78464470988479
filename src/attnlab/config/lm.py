"""Configs of the language models: the decoder-only Transformer (GPT-2, Llama and Mixtral styles)
and the LSTM, causal-convolution and bigram baselines, with their presets; and ``LMTaskConfig``, the data settings of
language-model training (config.json's ``"task"``).

    ModelConfig.preset("llama-tiny", d_model=128)   # a named preset with overrides
    LMTaskConfig(data="stdlib", tokenizer="bpe", vocab_size=1024, seq_len=256)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from attnlab.config.base import Config, ConfigError, TextStackConfig

__all__ = [
    "ModelConfig",
    "LSTMConfig",
    "ConvLMConfig",
    "BigramConfig",
    "CorpusTaskConfig",
    "LMTaskConfig",
    "PRESETS",
]

# Presets are data: a family's choices, a context, then the sizes (one preset a line)
_GPT2 = dict(
    ffn="mlp", activation="gelu_tanh", norm="layernorm", norm_eps=1e-5, position="learned",
    bias=True, tie_embeddings=True,
)  # fmt: skip
_LLAMA = dict(
    ffn="swiglu", activation="silu", norm="rmsnorm", norm_eps=1e-6, position="rope", bias=False,
    tie_embeddings=False, rope_theta=10000.0,
)  # fmt: skip
_MIXTRAL = dict(_LLAMA, ffn="moe", norm_eps=1e-5, rope_theta=1e6, moe_aux_coef=0.01)
_SMALL_CTX = dict(vocab_size=256, max_seq_len=128)
_GPT2_CTX = dict(vocab_size=50257, max_seq_len=1024)
_LLAMA_CTX = dict(vocab_size=32000, max_seq_len=1024)

#: Named presets. ``tiny`` runs in CPU seconds; ``*-small`` are GPT-2-small sized (124M for gpt2).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(_GPT2, **_SMALL_CTX, d_model=64, n_layers=2, n_heads=4),
    "gpt2-tiny": dict(_GPT2, **_SMALL_CTX, d_model=64, n_layers=2, n_heads=4),
    "gpt2-mini": dict(_GPT2, **_SMALL_CTX, d_model=128, n_layers=4, n_heads=4),
    "gpt2-small": dict(_GPT2, **_GPT2_CTX, d_model=768, n_layers=12, n_heads=12),
    "gpt2": dict(_GPT2, **_GPT2_CTX, d_model=768, n_layers=12, n_heads=12),
    "llama-tiny": dict(_LLAMA, **_SMALL_CTX, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2),
    "llama-mini": dict(_LLAMA, **_SMALL_CTX, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2),
    "llama-small": dict(_LLAMA, **_LLAMA_CTX, d_model=768, n_layers=12, n_heads=12, n_kv_heads=4),
    "mixtral-tiny": dict(
        _MIXTRAL, **_SMALL_CTX, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, n_experts=4,
        top_k=2, ffn_hidden=96,
    ),
    "mixtral-small": dict(
        _MIXTRAL, **_LLAMA_CTX, d_model=512, n_layers=8, n_heads=8, n_kv_heads=2, n_experts=8,
        top_k=2, ffn_hidden=1024,
    ),
}  # fmt: skip


#: fields every recorded model section of the first release has (and no preset or ``--set``
#: gives all of): such a section without ``embed_scale`` predates it
_RECORDED_BEFORE_SCALE = frozenset(
    {"activation_checkpointing", "init_std", "backend", "backend_options", "rope_theta",
     "n_experts", "moe_aux_coef", "attn_dropout", "norm_eps", "qk_norm", "top_k"}
)  # fmt: skip


@dataclass
class ModelConfig(TextStackConfig):
    """A decoder-only Transformer language model: the block and stack fields
    (:class:`~attnlab.config.base.TextStackConfig`: ``vocab_size``, ``max_seq_len``,
    ``n_layers``, ``tie_embeddings``, ``init_std``) plus the LM's own.

    Defaults are GPT-2's choices (learned positions, pre-LayerNorm, tanh-GELU MLP, biases, tied
    embeddings) at a CPU-friendly size.

    Attributes:
        activation_checkpointing: recompute each block in backward (saves memory).
        embed_scale: the token embeddings are multiplied by this before positions are added
            (None: √d_model for ``sinusoidal`` positions, as in the Transformer paper §3.4, so
            that sinusoids of amplitude 1 do not drown embeddings initialised at ``init_std``;
            1.0 otherwise). A run records the resolved value; a model section recorded before
            this field existed reads as 1.0, the behaviour it was trained with.
        logit_softcap: None, or c > 0: the logits are ``c · tanh(z / c)`` (Gemma 2,
            modded-nanogpt), so every |logit| < c.
        zero_init_proj: initialise each block's residual output projections (attention out,
            FFN out) to zero (modded-nanogpt), so at initialisation every block is the identity.
        value_embeds: k extra embedding tables (modded-nanogpt's value embeddings), each
            ``V × (n_kv_heads · head_dim)``: table i is looked up with the input tokens and added
            to the attention values of layer i and of its mirror layer L−1−i, with a learned
            scalar weight per layer (initialised to 0.5): ``v ← v + λ_l · E_i[idx]``. 0 (the
            default) is none; at most ⌈L/2⌉.
        unet_skips: skip connections across the stack (modded-nanogpt's U-Net): the output of
            block i of the first half (i < ⌊L/2⌋) is added, times a learned scalar initialised
            to 1, to the input of its mirror block L−1−i. Needs n_layers ≥ 2. The innermost
            pair's skip is the block's own input (with 2 layers, block 1 reads
            ``(1 + w) ·`` block 0's output), as in modded-nanogpt.
        token_shift: each token's embedding adds ``μ ⊙`` the previous token's embedding,
            ``e_t ← e_t + μ ⊙ e_{t−1}`` with one learned weight per channel μ initialised to 0
            (RWKV's token shift; modded-nanogpt's "smear" is a gated form of it): the stack
            starts from a bigram's view of the text. The first token of a sequence (and one
            after padding) has no predecessor.
    """

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = PRESETS

    activation_checkpointing: bool = False
    embed_scale: float | None = None
    logit_softcap: float | None = None
    zero_init_proj: bool = False
    value_embeds: int = 0
    unet_skips: bool = False
    token_shift: bool = False

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelConfig:
        if isinstance(d, Mapping) and "embed_scale" not in d and _RECORDED_BEFORE_SCALE <= set(d):
            d = {**d, "embed_scale": 1.0}  # recorded by an earlier release: no scale then
        return super().from_dict(d)

    def validate(self) -> None:
        super().validate()
        if self.embed_scale is None:
            self.embed_scale = math.sqrt(self.d_model) if self.position == "sinusoidal" else 1.0
        self.positive("embed_scale")
        if self.logit_softcap is not None:
            self.positive("logit_softcap")
        most = (self.n_layers + 1) // 2  # table i feeds layer i and layer L-1-i
        if type(self.value_embeds) is not int or not 0 <= self.value_embeds <= most:
            raise ConfigError(
                f"value_embeds must be an integer from 0 to ceil(n_layers / 2) = {most} (table "
                f"i feeds layer i and its mirror n_layers-1-i), got {self.value_embeds!r}"
            )
        if self.unet_skips and self.n_layers < 2:
            raise ConfigError(
                f"unet_skips needs n_layers >= 2 (a first half to skip from), got {self.n_layers}"
            )


@dataclass
class LSTMConfig(Config):
    """An LSTM language model. ``max_seq_len`` is the training window (generation slides it)."""

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(emb_dim=32, hidden=64),
        "small": dict(emb_dim=128, hidden=256),
        "medium": dict(emb_dim=256, hidden=512, n_layers=2),
    }

    vocab_size: int = 256
    max_seq_len: int = 128
    emb_dim: int = 128
    hidden: int = 256
    n_layers: int = 1
    dropout: float = 0.0
    tie_embeddings: bool = False  # needs emb_dim == hidden

    def validate(self) -> None:
        super().validate()
        self.positive("vocab_size", "max_seq_len", "emb_dim", "hidden", "n_layers")
        self.fraction("dropout")
        if self.tie_embeddings and self.emb_dim != self.hidden:
            raise ConfigError(
                f"tie_embeddings needs emb_dim == hidden, got {self.emb_dim} and {self.hidden}"
            )


@dataclass
class ConvLMConfig(Config):
    """A causal dilated-convolution language model (WaveNet/TCN style): one residual block per
    entry of ``dilations``, each a causal convolution of ``kernel_size`` taps spaced by its
    dilation. ``max_seq_len`` is the training window (generation slides it).

    Attributes:
        width: the channels of every layer (the embedding width too).
        kernel_size: taps k of each convolution.
        dilations: one block per entry, the spacing d of its taps (1, 2, 4, ... doubles the
            reach per layer).
        dropout: on the embeddings and each block's output.
        tie_embeddings: the output head shares the embedding matrix.
    """

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(width=64, kernel_size=3, dilations=(1, 2, 4, 8)),
        "small": dict(width=128, kernel_size=3, dilations=(1, 2, 4, 8, 16, 32)),
    }

    vocab_size: int = 256
    max_seq_len: int = 128
    width: int = 128
    kernel_size: int = 3
    dilations: tuple[int, ...] = (1, 2, 4, 8)
    dropout: float = 0.0
    tie_embeddings: bool = False

    @property
    def receptive_field(self) -> int:
        """Tokens an output can see, itself included: 1 + Σ_l (k − 1)·d_l. The output at t
        depends on the tokens t − (R − 1) … t and on none before."""
        return 1 + sum((self.kernel_size - 1) * d for d in self.dilations)

    def validate(self) -> None:
        super().validate()
        self.positive("vocab_size", "max_seq_len", "width", "kernel_size")
        self.fraction("dropout")
        if not self.dilations:
            raise ConfigError("dilations must name at least one layer, got an empty list")
        if any(d < 1 for d in self.dilations):
            raise ConfigError(f"every dilation must be a positive integer, got {self.dilations}")


@dataclass
class BigramConfig(Config):
    """A table of next-token logits indexed by the current token."""

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {"tiny": {}}

    vocab_size: int = 256
    max_seq_len: int = 128

    def validate(self) -> None:
        super().validate()
        self.positive("vocab_size", "max_seq_len")


@dataclass
class CorpusTaskConfig(Config):
    """The settings of a task on one text corpus (language modelling, masked-LM training): which
    corpus, how it is tokenised, cut and split. Its ``to_dict()`` is config.json's ``"task"`` (the
    task adds the derived token counts ``n_tokens``, which are accepted and dropped on input).

    Attributes:
        type: the task (tells it from other families' tasks in config.json).
        data: ``pydoc``, ``stdlib``, or a path to a text file or folder (a run stores it absolute).
        tokenizer: ``char`` (the corpus's characters) or ``bpe`` (byte-level BPE trained on it).
        vocab_size: the BPE vocabulary size (at least 256); a run records the tokenizer's actual
            size (for ``char``: the number of distinct characters).
        seq_len: tokens per training example, which is also the model's context ``max_seq_len``.
        seed: seeds the window positions (None: the training seed).
        val_fraction: the fraction of the token ids held out for validation.
        max_chars: use only the first this many characters of the corpus.
    """

    IGNORED: ClassVar[frozenset[str]] = frozenset({"n_tokens"})

    type: str = ""
    data: str = "pydoc"
    tokenizer: Literal["char", "bpe"] = "char"
    vocab_size: int = 512
    seq_len: int = 128
    seed: int | None = None
    val_fraction: float = 0.1
    max_chars: int | None = None

    def validate(self) -> None:
        super().validate()
        self.positive("vocab_size", "max_chars")
        self.positive("seed", allow_zero=True)
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"val_fraction must be in (0, 1), got {self.val_fraction!r}")


@dataclass
class LMTaskConfig(CorpusTaskConfig):
    """Next-token prediction on one corpus: what ``attnlab train lm`` reads and tokenises (the
    fields of :class:`CorpusTaskConfig`, and ``val_block``).

    Attributes:
        type: always ``"lm"``.
        seq_len: training window T, which is also the model's context ``max_seq_len``.
        val_fraction: the last ``val_fraction`` of every block of ``val_block`` tokens is held
            out for validation.
        val_block: tokens per held-out block (default 2^20). A corpus of at most one block, or
            ``None``, is one block: its last ``val_fraction`` is validation. A run's config.json
            from before this field (it has ``n_tokens`` but no ``val_block``) reads as ``None``:
            such runs held out the tail, and still evaluate on it.
    """

    type: Literal["lm"] = "lm"
    val_block: int | None = 1 << 20

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LMTaskConfig:
        if isinstance(d, Mapping) and "n_tokens" in d and "val_block" not in d:
            d = {**d, "val_block": None}  # a first-release run: the tail was held out
        return super().from_dict(d)

    def validate(self) -> None:
        super().validate()
        self.positive("seq_len", "val_block")
