"""RNN encoder–decoders: fixed-context bottleneck (``rnn``) and Bahdanau attention (``rnn-attn``).

Encoder (both kinds): a GRU/LSTM reads the source, giving states h_1 … h_S (bidirectional by
default: forward and backward states concatenated) and a final state h_fin (the last forward and
first backward state — the only summary the ``rnn`` decoder ever sees).

Decoder step t (both kinds; only how the context c_t is made differs):

    rnn:       c_t = h_fin                                     the same vector at every step
    rnn-attn:  e_tj = vᵀ tanh(W_s s_{t-1} + W_h h_j),  α_t = softmax(e_t),  c_t = Σ_j α_tj h_j
    s_t        = Cell([Emb(y_{t-1}); c_t], s_{t-1})            s_0 = tanh(W_b h_fin)
    logits_t   = W_o [s_t; c_t]

So ``rnn`` gets everything about the source through one fixed-size vector (Cho et al. 2014;
Sutskever et al. 2014), while ``rnn-attn`` recomputes a new summary of all source states at every
step (Bahdanau, Cho & Bengio 2015). The two share every other weight shape, which is what makes
the bottleneck experiment a fair comparison.

Shape legend: B batch, S source length, T target length, E embedding width, Hd decoder state
width, Hk encoder state width (Dir·hidden), V target vocabulary.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnlab.attention.additive import AdditiveAttention
from attnlab.data.translation import load_vocabs
from attnlab.models.registry import register_kind

__all__ = ["RNNSeq2SeqConfig", "RNNSeq2Seq", "AttnRNNSeq2Seq", "RNNDecodeState"]

_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(emb_dim=32, hidden=64, n_layers=1),
    "small": dict(emb_dim=64, hidden=128, n_layers=1),
    "base": dict(emb_dim=256, hidden=512, n_layers=2, dropout=0.2),
}


@dataclass
class RNNSeq2SeqConfig:
    """Configuration of the RNN encoder–decoders.

    Args:
        src_vocab_size, tgt_vocab_size: vocabulary sizes (set from the data).
        cell: ``gru`` | ``lstm``.
        emb_dim: token embedding width E (both sides).
        hidden: RNN state width per direction (the decoder state is ``hidden`` wide).
        n_layers: encoder layers (the decoder is one recurrent cell, stepped explicitly).
        bidirectional: bidirectional encoder (Bahdanau's choice).
        attn_dim: width of the additive-attention scoring layer (``rnn-attn``; default hidden).
        dropout: on embeddings and between encoder layers.
        pad_id: padding id.
    """

    src_vocab_size: int = 1000
    tgt_vocab_size: int = 1000
    cell: str = "gru"
    emb_dim: int = 64
    hidden: int = 128
    n_layers: int = 1
    bidirectional: bool = True
    attn_dim: int | None = None
    dropout: float = 0.0
    pad_id: int = 0

    def __post_init__(self) -> None:
        if self.cell not in ("gru", "lstm"):
            raise ValueError(f"unknown cell {self.cell!r}; choose 'gru' or 'lstm'")
        if (
            min(self.src_vocab_size, self.tgt_vocab_size, self.emb_dim, self.hidden, self.n_layers)
            < 1
        ):
            raise ValueError(
                f"sizes must be positive: src_vocab_size={self.src_vocab_size}, "
                f"tgt_vocab_size={self.tgt_vocab_size}, emb_dim={self.emb_dim}, "
                f"hidden={self.hidden}, n_layers={self.n_layers}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    @property
    def enc_dim(self) -> int:
        return self.hidden * (2 if self.bidirectional else 1)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> RNNSeq2SeqConfig:
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown RNNSeq2SeqConfig fields: {sorted(unknown)}")
        return cls(**d)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> RNNSeq2SeqConfig:
        """Named sizes (``tiny``, ``small``, ``base``) with overrides.

        Raises:
            ValueError: unknown preset name.
        """
        if name not in _PRESETS:
            raise ValueError(
                f"unknown RNNSeq2SeqConfig preset {name!r}; choose from {sorted(_PRESETS)}"
            )
        return cls(**{**_PRESETS[name], **overrides})

    @staticmethod
    def presets() -> list[str]:
        return sorted(_PRESETS)


@dataclass
class RNNDecodeState:
    """Decoder state between steps: s (and the LSTM cell), encoder states and their projection."""

    s: Tensor  # (B, Hd)
    cell: Tensor | None  # (B, Hd) for LSTM
    keys: Tensor  # (B, S, Hk)
    keys_proj: Tensor | None  # (B, S, A) precomputed W_h h (rnn-attn)
    final: Tensor  # (B, Hk) h_fin, the fixed context of the rnn model
    src_mask: Tensor  # (B, S)
    weights: Tensor | None = None  # α of the last step (B, S) (rnn-attn)

    def reorder(self, index: Tensor) -> RNNDecodeState:
        """Keep rows ``index`` (beam search)."""

        def pick(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.index_select(0, index)

        return RNNDecodeState(
            pick(self.s),
            pick(self.cell),
            pick(self.keys),
            pick(self.keys_proj),
            pick(self.final),
            pick(self.src_mask),
        )


class RNNSeq2Seq(nn.Module):
    """GRU/LSTM encoder–decoder whose decoder sees only the encoder's final state.

    ``forward(src (B,S), src_mask (B,S), tgt_in (B,T)) -> logits (B,T,V)`` (teacher forcing).
    """

    kind: ClassVar[str] = "rnn"
    uses_attention: ClassVar[bool] = False

    def __init__(self, config: RNNSeq2SeqConfig) -> None:
        super().__init__()
        self.config = c = config
        rnn_cls = nn.GRU if c.cell == "gru" else nn.LSTM
        cell_cls = nn.GRUCell if c.cell == "gru" else nn.LSTMCell
        self.src_emb = nn.Embedding(c.src_vocab_size, c.emb_dim, padding_idx=c.pad_id)
        self.tgt_emb = nn.Embedding(c.tgt_vocab_size, c.emb_dim, padding_idx=c.pad_id)
        self.drop = nn.Dropout(c.dropout)
        self.encoder = rnn_cls(
            c.emb_dim,
            c.hidden,
            num_layers=c.n_layers,
            batch_first=True,
            bidirectional=c.bidirectional,
            dropout=c.dropout if c.n_layers > 1 else 0.0,
        )
        self.bridge = nn.Linear(c.enc_dim, c.hidden)  # s_0 = tanh(W_b h_fin)
        self.cell = cell_cls(c.emb_dim + c.enc_dim, c.hidden)
        self.attention: nn.Module | None = (
            AdditiveAttention(c.hidden, c.enc_dim, c.attn_dim) if self.uses_attention else None
        )
        self.out = nn.Linear(c.hidden + c.enc_dim, c.tgt_vocab_size)
        self.last_weights: Tensor | None = None  # (B, T, S) after forward(need_weights=True)

    # -- encoder
    def encode(self, src: Tensor, src_mask: Tensor) -> tuple[Tensor, Tensor]:
        """Encoder states ``(B, S, Hk)`` (zeros at padding) and the final state ``(B, Hk)``."""
        lengths = src_mask.sum(1).clamp(min=1).cpu()
        packed = pack_padded_sequence(
            self.drop(self.src_emb(src)), lengths, batch_first=True, enforce_sorted=False
        )
        out, h = self.encoder(packed)
        keys, _ = pad_packed_sequence(out, batch_first=True, total_length=src.shape[1])
        h = h[0] if isinstance(h, tuple) else h  # LSTM: (h, c); the summary is h
        n_dir = 2 if self.config.bidirectional else 1
        last = h.view(self.config.n_layers, n_dir, src.shape[0], -1)[-1]  # (Dir, B, hidden)
        final = last.transpose(0, 1).reshape(src.shape[0], -1)  # (B, Dir·hidden)
        return keys, final

    # -- decoder
    def start_decoding(self, src: Tensor, src_mask: Tensor, max_len: int = 0) -> RNNDecodeState:
        """Encode the source and set ``s_0``; ``max_len`` is unused (no cache to size)."""
        keys, final = self.encode(src, src_mask)
        s = torch.tanh(self.bridge(final))
        cell = torch.zeros_like(s) if self.config.cell == "lstm" else None
        kp = self.attention.project_keys(keys) if self.attention is not None else None
        return RNNDecodeState(s, cell, keys, kp, final, src_mask)

    def _context(self, st: RNNDecodeState) -> tuple[Tensor, Tensor | None]:
        if self.attention is None:
            return st.final, None
        return self.attention(st.s, st.keys, st.src_mask, keys_proj=st.keys_proj)

    def decode_step(
        self, prev: Tensor, state: RNNDecodeState, *, need_weights: bool = False
    ) -> tuple[Tensor, RNNDecodeState]:
        """Logits ``(B, V)`` of the token after ``prev (B,)``, and the advanced state.

        For ``rnn-attn`` the step's attention ``α (B, S)`` is in ``state.weights``.
        """
        context, alpha = self._context(state)  # (B, Hk), (B, S)
        x = torch.cat([self.drop(self.tgt_emb(prev)), context], dim=-1)  # (B, E + Hk)
        if state.cell is None:
            s, cell = self.cell(x, state.s), None
        else:
            s, cell = self.cell(x, (state.s, state.cell))
        new = RNNDecodeState(
            s, cell, state.keys, state.keys_proj, state.final, state.src_mask, alpha
        )
        return self.out(torch.cat([s, context], dim=-1)), new

    def forward(
        self, src: Tensor, src_mask: Tensor, tgt_in: Tensor, *, need_weights: bool = False
    ) -> Tensor:
        """Teacher-forced logits ``(B, T, V)``: the decoder reads the true previous tokens."""
        state = self.start_decoding(src, src_mask)
        logits, weights = [], []
        for t in range(tgt_in.shape[1]):
            step, state = self.decode_step(tgt_in[:, t], state)
            logits.append(step)
            weights.append(state.weights)
        self.last_weights = (
            torch.stack(weights, 1) if need_weights and self.attention is not None else None
        )  # (B, T, S)
        return torch.stack(logits, dim=1)  # (B, T, V)


class AttnRNNSeq2Seq(RNNSeq2Seq):
    """The same encoder–decoder with Bahdanau additive attention recomputed at every step."""

    kind: ClassVar[str] = "rnn-attn"
    uses_attention: ClassVar[bool] = True


register_kind(RNNSeq2Seq.kind, RNNSeq2SeqConfig, RNNSeq2Seq, artifacts="translation_vocab")
register_kind(AttnRNNSeq2Seq.kind, RNNSeq2SeqConfig, AttnRNNSeq2Seq, artifacts="translation_vocab")
