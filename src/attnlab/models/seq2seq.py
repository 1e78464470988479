"""The Transformer encoder–decoder of "Attention Is All You Need" (Vaswani et al., 2017).

    memory = Encoder(Emb_src(x)·√d + PE)                    N × [self-attention, FFN]
    logits = Decoder(Emb_tgt(y_<t)·√d + PE, memory) W_out   N × [causal self-attn, cross-attn, FFN]

The defaults are the paper's: post-norm residuals, sinusoidal positions, ReLU FFN, encoder
self-attention that ignores source padding, decoder self-attention that is causal, and
cross-attention from every decoder position to the (unpadded) encoder outputs. Pre-norm, RoPE,
learned positions, RMSNorm, SwiGLU... are fields of :class:`Seq2SeqConfig`. Every block is built
with :func:`attnlab.layers.build_block`, the same block the decoder-only LM and ViT use.

For decoding, :meth:`Seq2SeqTransformer.start_decoding` encodes the source once and makes one
self-attention KV cache and one cross-attention KV cache per decoder layer; each
:meth:`decode_step` then costs one new query per layer.

Shape legend: B batch, S source length, T target length, C d_model, V target vocabulary,
L decoder layers, H heads.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from attnlab.attention.cache import KVCache
from attnlab.data.translation import load_vocabs
from attnlab.layers import build_block, make_norm
from attnlab.layers.position import LearnedPositionalEmbedding, SinusoidalPositionalEmbedding
from attnlab.models.registry import register_kind

__all__ = ["Seq2SeqConfig", "Seq2SeqTransformer", "DecodeState"]

_POSITIONS = ("sinusoidal", "learned", "rope", "none")

_PRESETS: dict[str, dict[str, Any]] = {
    # Transformer base of the paper (65M parameters with a 37k shared vocabulary)
    "vaswani": dict(
        d_model=512,
        n_heads=8,
        n_enc_layers=6,
        n_dec_layers=6,
        ffn_hidden=2048,
        dropout=0.1,
        max_seq_len=256,
    ),
    # Transformer big
    "vaswani-big": dict(
        d_model=1024,
        n_heads=16,
        n_enc_layers=6,
        n_dec_layers=6,
        ffn_hidden=4096,
        dropout=0.3,
        max_seq_len=256,
    ),
    # a few minutes of CPU: the numbers/dates tasks
    "small": dict(
        d_model=128,
        n_heads=4,
        n_enc_layers=3,
        n_dec_layers=3,
        ffn_hidden=512,
        dropout=0.1,
        max_seq_len=128,
    ),
    # seconds of CPU: tests
    "tiny": dict(
        d_model=64,
        n_heads=4,
        n_enc_layers=2,
        n_dec_layers=2,
        ffn_hidden=128,
        dropout=0.0,
        max_seq_len=64,
    ),
}


@dataclass
class Seq2SeqConfig:
    """Configuration of :class:`Seq2SeqTransformer` (defaults: the paper's base model).

    Args:
        src_vocab_size, tgt_vocab_size: vocabulary sizes (set from the data).
        d_model, n_heads, n_kv_heads, head_dim: widths and heads (n_kv_heads < n_heads = GQA).
        n_enc_layers, n_dec_layers: stack depths N (6 and 6 in the paper).
        ffn, ffn_hidden, activation: FFN type, inner width (4·d_model default), activation.
        norm, norm_eps, norm_position: ``layernorm``/``rmsnorm``, ε, ``post`` (paper) or ``pre``.
        final_norm: a norm after each stack. Pre-norm needs it (forced on); the paper's post-norm
            model has none, torch.nn.Transformer has one (``True`` reproduces it).
        position: ``sinusoidal`` (paper) | ``learned`` | ``rope`` | ``none``.
        rope_theta: RoPE base.
        max_seq_len: longest source/target (position tables and KV caches).
        scale_embeddings: multiply embeddings by √d_model (paper §3.4).
        tie_embeddings: share the target embedding with the output projection (paper §3.4).
        bias: biases in linear layers and norms.
        qk_norm: ``None`` | ``rmsnorm`` | ``layernorm``.
        dropout: residual/embedding dropout (0.1 in the paper). attn_dropout: on attention weights.
        backend: attention backend name.
        pad_id: padding id of both vocabularies.
    """

    src_vocab_size: int = 1000
    tgt_vocab_size: int = 1000
    d_model: int = 512
    n_heads: int = 8
    n_kv_heads: int | None = None
    head_dim: int | None = None
    n_enc_layers: int = 6
    n_dec_layers: int = 6
    ffn: str = "mlp"
    ffn_hidden: int | None = None
    activation: str = "relu"
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    norm_position: str = "post"
    final_norm: bool = False
    position: str = "sinusoidal"
    rope_theta: float = 10000.0
    max_seq_len: int = 256
    scale_embeddings: bool = True
    tie_embeddings: bool = True
    bias: bool = True
    qk_norm: str | None = None
    dropout: float = 0.1
    attn_dropout: float = 0.0
    backend: str = "auto"
    backend_options: dict = field(default_factory=dict)
    pad_id: int = 0

    def __post_init__(self) -> None:
        if self.src_vocab_size < 1 or self.tgt_vocab_size < 1:
            raise ValueError(
                f"vocabulary sizes must be positive, got src={self.src_vocab_size}, "
                f"tgt={self.tgt_vocab_size}"
            )
        if self.head_dim is None and self.d_model % self.n_heads != 0:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        if self.n_enc_layers < 1 or self.n_dec_layers < 1:
            raise ValueError(
                f"need at least one layer, got n_enc_layers={self.n_enc_layers}, "
                f"n_dec_layers={self.n_dec_layers}"
            )
        if self.position not in _POSITIONS:
            raise ValueError(f"unknown position {self.position!r}; choose from {list(_POSITIONS)}")
        if self.norm_position not in ("pre", "post"):
            raise ValueError(f"norm_position must be 'pre' or 'post', got {self.norm_position!r}")
        if self.position == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"sinusoidal positions need an even d_model, got {self.d_model}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.norm_position == "pre":
            self.final_norm = True  # without it the residual stream is never normalised

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Seq2SeqConfig:
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown Seq2SeqConfig fields: {sorted(unknown)}")
        return cls(**d)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> Seq2SeqConfig:
        """A named configuration (``vaswani``, ``vaswani-big``, ``small``, ``tiny``) with overrides.

        Raises:
            ValueError: unknown preset name.
        """
        if name not in _PRESETS:
            raise ValueError(
                f"unknown Seq2SeqConfig preset {name!r}; choose from {sorted(_PRESETS)}"
            )
        return cls(**{**_PRESETS[name], **overrides})

    @staticmethod
    def presets() -> list[str]:
        return sorted(_PRESETS)


@dataclass
class DecodeState:
    """Everything one decoding step needs: encoder output, masks and the KV caches."""

    memory: Tensor  # (B, S, C)
    src_mask: Tensor  # (B, S) bool
    self_caches: list[KVCache]
    cross_caches: list[KVCache]
    weights: Tensor | None = None  # cross-attention of the last step (L, B, H, S) when recorded

    def reorder(self, index: Tensor) -> DecodeState:
        """Keep rows ``index`` (beam search)."""
        for c in (*self.self_caches, *self.cross_caches):
            c.reorder(index)
        return DecodeState(
            self.memory.index_select(0, index),
            self.src_mask.index_select(0, index),
            self.self_caches,
            self.cross_caches,
        )


class Seq2SeqTransformer(nn.Module):
    """Transformer encoder–decoder.

    ``forward(src (B,S), src_mask (B,S) bool, tgt_in (B,T)) -> logits (B,T,V)`` (teacher forcing).
    """

    kind: ClassVar[str] = "transformer"

    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__()
        self.config = c = config
        self.src_emb = nn.Embedding(c.src_vocab_size, c.d_model, padding_idx=c.pad_id)
        self.tgt_emb = nn.Embedding(c.tgt_vocab_size, c.d_model, padding_idx=c.pad_id)
        if c.position == "sinusoidal":
            self.pos_emb: nn.Module | None = SinusoidalPositionalEmbedding(c.max_seq_len, c.d_model)
        elif c.position == "learned":
            self.pos_emb = LearnedPositionalEmbedding(c.max_seq_len, c.d_model)
        else:
            self.pos_emb = None  # rope lives inside attention; none = no positions
        self.drop = nn.Dropout(c.dropout)
        block_kw = dict(
            n_kv_heads=c.n_kv_heads,
            head_dim=c.head_dim,
            ffn=c.ffn,
            ffn_hidden=c.ffn_hidden,
            activation=c.activation,
            norm=c.norm,
            norm_eps=c.norm_eps,
            norm_position=c.norm_position,
            bias=c.bias,
            qk_norm=c.qk_norm,
            position="rope" if c.position == "rope" else "none",
            rope_theta=c.rope_theta,
            dropout=c.dropout,
            attn_dropout=c.attn_dropout,
            backend=c.backend,
            backend_options=c.backend_options,
        )
        self.encoder = nn.ModuleList(
            build_block(c.d_model, c.n_heads, **block_kw) for _ in range(c.n_enc_layers)
        )
        self.decoder = nn.ModuleList(
            build_block(c.d_model, c.n_heads, cross_attention=True, **block_kw)
            for _ in range(c.n_dec_layers)
        )

        def final() -> nn.Module:
            if not c.final_norm:
                return nn.Identity()
            return make_norm(c.norm, c.d_model, eps=c.norm_eps, bias=c.bias)

        self.enc_norm, self.dec_norm = final(), final()
        self.lm_head = nn.Linear(c.d_model, c.tgt_vocab_size, bias=False)
        self.apply(self._init_weights)
        if c.tie_embeddings:
            self.lm_head.weight = self.tgt_emb.weight

    def _init_weights(self, m: nn.Module) -> None:
        # Xavier-uniform for matrices (the reference implementations' choice), N(0, d^-1/2) for
        # embeddings so that ×√d brings them to unit scale.
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=self.config.d_model**-0.5)
            if m.padding_idx is not None:
                with torch.no_grad():
                    m.weight[m.padding_idx].zero_()

    # -- embeddings
    def _embed(self, emb: nn.Embedding, ids: Tensor, offset: int = 0) -> Tensor:
        if ids.shape[1] + offset > self.config.max_seq_len and self.pos_emb is not None:
            raise ValueError(
                f"sequence of length {ids.shape[1] + offset} exceeds "
                f"max_seq_len={self.config.max_seq_len}"
            )
        x = emb(ids)  # (B, T, C)
        if self.config.scale_embeddings:
            x = x * math.sqrt(self.config.d_model)
        if self.pos_emb is not None:
            pos = torch.arange(offset, offset + ids.shape[1], device=ids.device)
            x = x + self.pos_emb(pos)
        return self.drop(x)

    def embed_source(self, src: Tensor) -> Tensor:
        return self._embed(self.src_emb, src)

    def embed_target(self, tgt: Tensor, offset: int = 0) -> Tensor:
        return self._embed(self.tgt_emb, tgt, offset)

    # -- the two stacks on embedded inputs (used by the parity test against torch.nn.Transformer)
    def run_encoder(self, x: Tensor, src_mask: Tensor | None) -> Tensor:
        """Encoder stack on embedded ``x (B, S, C)``; ``src_mask (B, S)`` True = real token."""
        mask = None if src_mask is None else src_mask[:, None, None, :]  # (B, 1, 1, S)
        for block in self.encoder:
            x = block(x, mask=mask)
        return self.enc_norm(x)

    def run_decoder(
        self,
        y: Tensor,
        memory: Tensor,
        src_mask: Tensor | None,
        *,
        caches: DecodeState | None = None,
        need_weights: bool = False,
    ) -> Tensor:
        """Decoder stack on embedded ``y (B, T, C)``: causal self-attention, cross-attention to
        ``memory (B, S, C)`` restricted to the real source positions."""
        ctx_mask = None if src_mask is None else src_mask[:, None, None, :]  # (B, 1, 1, S)
        for i, block in enumerate(self.decoder):
            y = block(
                y,
                is_causal=True,
                context=memory,
                context_mask=ctx_mask,
                cache=None if caches is None else caches.self_caches[i],
                cross_cache=None if caches is None else caches.cross_caches[i],
                need_weights=need_weights,
            )
        return self.dec_norm(y)

    # -- training
    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        """``memory (B, S, C)`` for ``src (B, S)``."""
        return self.run_encoder(self.embed_source(src), src_mask)

    def forward(
        self, src: Tensor, src_mask: Tensor, tgt_in: Tensor, *, need_weights: bool = False
    ) -> Tensor:
        """Teacher-forced logits ``(B, T, V)`` for ``tgt_in = <start> y_1 … y_{T-1}``."""
        memory = self.encode(src, src_mask)
        y = self.run_decoder(self.embed_target(tgt_in), memory, src_mask, need_weights=need_weights)
        return self.lm_head(y)

    def cross_attention(self) -> Tensor | None:
        """Cross-attention weights ``(L, B, H, T, S)`` of the last ``need_weights=True`` call."""
        ws = [b.cross_weights for b in self.decoder]
        return None if any(w is None for w in ws) else torch.stack(ws)

    # -- incremental decoding
    def start_decoding(self, src: Tensor, src_mask: Tensor, max_len: int) -> DecodeState:
        """Encode once and allocate per-layer self/cross KV caches for ``max_len`` steps."""
        memory = self.encode(src, src_mask)
        B, S = src.shape
        self_caches = [b.attn.make_cache(B, max_len) for b in self.decoder]
        cross_caches = [b.cross_attn.make_cache(B, S) for b in self.decoder]
        return DecodeState(memory, src_mask, self_caches, cross_caches)

    def decode_step(
        self, prev: Tensor, state: DecodeState, *, need_weights: bool = False
    ) -> tuple[Tensor, DecodeState]:
        """Logits ``(B, V)`` of the next token after ``prev (B,)``; the caches advance one step.

        With ``need_weights`` the step's cross-attention ``(L, B, H, S)`` is in ``state.weights``.
        """
        t = state.self_caches[0].length
        y = self.embed_target(prev[:, None], offset=t)  # (B, 1, C)
        y = self.run_decoder(
            y, state.memory, state.src_mask, caches=state, need_weights=need_weights
        )
        if need_weights:
            state.weights = torch.stack([b.cross_weights[:, :, 0] for b in self.decoder])
        return self.lm_head(y[:, 0]), state


register_kind(
    Seq2SeqTransformer.kind, Seq2SeqConfig, Seq2SeqTransformer, artifacts="translation_vocab"
)
