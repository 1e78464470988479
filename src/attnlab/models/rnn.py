"""RNN encoder–decoders: fixed-context bottleneck (``rnn``) and Bahdanau attention (``rnn-attn``).

Encoder (both kinds): a GRU/LSTM/vanilla tanh RNN (``cell``) reads the source, giving states
h_1 … h_S (bidirectional by default: forward and backward states concatenated) and a final state
h_fin (the last forward and first backward state — the only summary the ``rnn`` decoder ever sees).

Decoder step t (both kinds; only how the context c_t is made differs):

    rnn:       c_t = h_fin                                     the same vector at every step
    rnn-attn:  e_tj = vᵀ tanh(W_s s_{t-1} + W_h h_j),  α_t = softmax(e_t),  c_t = Σ_j α_tj h_j
    s_t        = Cell([Emb(y_{t-1}); c_t], s_{t-1})            s_0 = tanh(W_b h_fin)
    logits_t   = W_o [s_t; c_t]

``score`` replaces Bahdanau's e_tj by the lecture's other alignment scores (one linear layer on
[s; h], dot, bilinear; :mod:`attnlab.attention.additive`) and ``init_state`` replaces s_0 by the
forward encoder state after the last real token (``last``) or zeros (``zeros``).

So ``rnn`` gets everything about the source through one fixed-size vector (Cho et al. 2014;
Sutskever et al. 2014), while ``rnn-attn`` recomputes a new summary of all source states at every
step (Bahdanau, Cho & Bengio 2015). The two share every other weight shape, which is what makes
the bottleneck experiment a fair comparison.

Shape legend: B batch, S source length, T target length, E embedding width, Hd decoder state
width, Hk encoder state width (Dir·hidden), V target vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnlab.attention.additive import AdditiveAttention
from attnlab.attention.cache import DecodeState
from attnlab.attention.capture import capture_attention
from attnlab.config.translation import RNNSeq2SeqConfig
from attnlab.layers.hook import HookPoint
from attnlab.layers.rnn import rnn_cell, stacked_rnn
from attnlab.models.registry import register_kind

__all__ = ["RNNSeq2SeqConfig", "RNNSeq2Seq", "AttnRNNSeq2Seq", "RNNDecodeState"]


@dataclass
class RNNDecodeState(DecodeState):
    """Decoder state between steps: s (and the LSTM cell), encoder states and their projection."""

    s: Tensor  # (B, Hd)
    cell: Tensor | None  # (B, Hd) for LSTM
    keys: Tensor  # (B, S, Hk)
    keys_proj: Tensor | None  # (B, S, A) precomputed W_h h (rnn-attn)
    final: Tensor  # (B, Hk) h_fin, the fixed context of the rnn model
    src_mask: Tensor  # (B, S)


class RNNSeq2Seq(nn.Module):
    """GRU/LSTM/RNN encoder–decoder whose decoder sees only the encoder's final state.

    ``forward(src (B,S), src_mask (B,S), tgt_in (B,T)) -> logits (B,T,V)`` (teacher forcing).
    """

    kind: ClassVar[str] = "rnn"
    uses_attention: ClassVar[bool] = False
    #: the decoder is a recurrence stepped explicitly, so training can feed it its own
    #: predictions step by step (scheduled sampling, ``forward(..., gold_mask=...)``)
    recurrent: ClassVar[bool] = True

    def __init__(self, config: RNNSeq2SeqConfig) -> None:
        super().__init__()
        self.config = c = config
        self.src_emb = nn.Embedding(c.src_vocab_size, c.emb_dim, padding_idx=c.pad_id)
        self.tgt_emb = nn.Embedding(c.tgt_vocab_size, c.emb_dim, padding_idx=c.pad_id)
        self.drop = nn.Dropout(c.dropout)
        # hook points (attnlab.inspect): source embeddings (B, S, E), encoder states (B, S, Hk),
        # and per decoder step the target embedding (B, E) and the new decoder state (B, hidden)
        self.hook_src_embed, self.hook_encoder_out = HookPoint(), HookPoint()
        self.hook_tgt_embed, self.hook_decoder_state = HookPoint(), HookPoint()
        self.encoder = stacked_rnn(
            c.cell,
            c.emb_dim,
            c.hidden,
            c.n_layers,
            dropout=c.dropout,
            bidirectional=c.bidirectional,
        )
        # s_0 = tanh(W_b h_fin) (init_state="projection"; the other choices have no weights)
        self.bridge = nn.Linear(c.enc_dim, c.hidden) if c.init_state == "projection" else None
        self.cell = rnn_cell(c.cell, c.emb_dim + c.enc_dim, c.hidden)
        self.attention: nn.Module | None = (
            AdditiveAttention(c.hidden, c.enc_dim, c.attn_dim, score=c.score)
            if self.uses_attention
            else None
        )
        self.out = nn.Linear(c.hidden + c.enc_dim, c.tgt_vocab_size)

    # -- encoder
    def encode(self, src: Tensor, src_mask: Tensor) -> tuple[Tensor, Tensor]:
        """Encoder states ``(B, S, Hk)`` (zeros at padding) and the final state ``(B, Hk)``."""
        lengths = src_mask.sum(1).clamp(min=1).cpu()
        packed = pack_padded_sequence(
            self.drop(self.hook_src_embed(self.src_emb(src))),
            lengths,
            batch_first=True,
            enforce_sorted=False,
        )
        out, h = self.encoder(packed)
        keys, _ = pad_packed_sequence(out, batch_first=True, total_length=src.shape[1])
        keys = self.hook_encoder_out(keys)
        h = h[0] if isinstance(h, tuple) else h  # LSTM: (h, c); the summary is h
        n_dir = 2 if self.config.bidirectional else 1
        last = h.view(self.config.n_layers, n_dir, src.shape[0], -1)[-1]  # (Dir, B, hidden)
        final = last.transpose(0, 1).reshape(src.shape[0], -1)  # (B, Dir·hidden)
        return keys, final

    # -- decoder (the incremental-decoding interface of attnlab.decoding)
    def initial_state(self, keys: Tensor, final: Tensor, src_mask: Tensor) -> Tensor:
        """The decoder's first state ``s_0 (B, hidden)`` chosen by ``config.init_state``:
        ``tanh(W_b h_fin)``, the forward encoder state at each row's last real token (top
        layer), or zeros."""
        c = self.config
        if c.init_state == "projection":
            return torch.tanh(self.bridge(final))
        if c.init_state == "zeros":
            return final.new_zeros(final.shape[0], c.hidden)
        last = (src_mask.sum(1) - 1).clamp(min=0)  # (B,) index of the last real token
        rows = torch.arange(keys.shape[0], device=keys.device)
        return keys[rows, last, : c.hidden]  # (B, hidden): the forward half of h_last

    def start_decoding(self, src: Tensor, src_mask: Tensor, max_len: int = 0) -> RNNDecodeState:
        """Encode the source and set ``s_0``; ``max_len`` is unused (no cache to size)."""
        keys, final = self.encode(src, src_mask)
        s = self.initial_state(keys, final, src_mask)
        cell = torch.zeros_like(s) if self.config.cell == "lstm" else None
        kp = self.attention.project_keys(keys) if self.attention is not None else None
        return RNNDecodeState(s, cell, keys, kp, final, src_mask)

    def _context(self, st: RNNDecodeState) -> Tensor:
        """c_t: h_fin (``rnn``) or Bahdanau's Σ_j α_tj h_j (``rnn-attn``, α reported to a
        capture)."""
        if self.attention is None:
            return st.final
        context, _ = self.attention(st.s, st.keys, st.src_mask, keys_proj=st.keys_proj)
        return context  # (B, Hk)

    def _step(self, prev: Tensor, state: RNNDecodeState) -> Tensor:
        """One decoder step on ``prev (B,)``: advances ``state``, returns logits ``(B, V)``."""
        context = self._context(state)  # (B, Hk)
        x = torch.cat([self.drop(self.hook_tgt_embed(self.tgt_emb(prev))), context], dim=-1)
        if state.cell is None:
            state.s = self.cell(x, state.s)
        else:
            state.s, state.cell = self.cell(x, (state.s, state.cell))
        state.s = self.hook_decoder_state(state.s)
        return self.out(torch.cat([state.s, context], dim=-1))

    def decode_step(self, tokens: Tensor, state: RNNDecodeState) -> tuple[Tensor, RNNDecodeState]:
        """Feed ``tokens (B, T)`` (``<start>`` first, then one token per step).

        Returns:
            ``(logits (B, V) of the token after the last one, state)``.
        """
        for t in range(tokens.shape[1]):
            logits = self._step(tokens[:, t], state)
        return logits, state

    def forward(
        self,
        src: Tensor,
        src_mask: Tensor,
        tgt_in: Tensor,
        *,
        need_weights: bool = False,
        gold_mask: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor | None]:
        """Teacher-forced logits ``(B, T, V)``: the decoder reads the true previous tokens.

        Args:
            need_weights: also return Bahdanau's α of every step, ``(B, T, S)`` (None for the
                fixed-context ``rnn``), read through :func:`attnlab.attention.capture_attention`.
            gold_mask: ``(B, T)`` bool, scheduled sampling (Bengio et al. 2015): where False,
                step t reads the model's own greedy prediction from step t-1 (no gradient
                through the choice) instead of ``tgt_in[:, t]``; step 0 always reads
                ``tgt_in[:, 0]`` (``<start>``). None = teacher forcing.
        """
        if need_weights:
            with capture_attention(self) as maps:
                logits = self(src, src_mask, tgt_in, gold_mask=gold_mask)
            steps = maps.calls("attention")
            return logits, torch.stack(steps, 1) if steps else None  # (B, T, S)
        state = self.start_decoding(src, src_mask)
        logits: list[Tensor] = []
        for t in range(tgt_in.shape[1]):
            prev = tgt_in[:, t]  # (B,)
            if gold_mask is not None and t > 0:
                own = logits[-1].detach().argmax(-1)  # (B,) the prediction of this input
                prev = torch.where(gold_mask[:, t], prev, own)
            logits.append(self._step(prev, state))
        return torch.stack(logits, dim=1)  # (B, T, V)


class AttnRNNSeq2Seq(RNNSeq2Seq):
    """The same encoder–decoder with Bahdanau additive attention recomputed at every step."""

    kind: ClassVar[str] = "rnn-attn"
    uses_attention: ClassVar[bool] = True


register_kind(RNNSeq2Seq.kind, RNNSeq2SeqConfig, RNNSeq2Seq, artifacts="translation_vocab")
register_kind(AttnRNNSeq2Seq.kind, RNNSeq2SeqConfig, AttnRNNSeq2Seq, artifacts="translation_vocab")
