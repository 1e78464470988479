"""Baseline language models: an LSTM LM and a bigram table, trained by the same code as DecoderLM.

    bigram:  p(x_t | x_<t) = softmax(W[x_{t−1}])            one row of logits per previous token
    LSTM:    h_t = LSTM(E[x_t], h_{t−1}),  logits_t = W_out h_t

The bigram model is the floor any context-using model must beat; the LSTM is the recurrent
baseline the Transformer replaced. Both take ``(B, T)`` token ids and return ``(B, T, V)`` logits,
like :class:`attnlab.DecoderLM`, so the LM task, ``attnlab eval`` and ``attnlab generate`` (without
a KV cache) work on them unchanged. Neither supports left padding.

Shape legend: B batch, T time, V vocab_size, E emb_dim, Hd hidden size.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor, nn

from attnlab.config import check_field_types
from attnlab.runs import register_kind

__all__ = ["LSTMConfig", "LSTMLM", "BigramConfig", "BigramLM"]


def _from_dict(cls, d: dict[str, Any]):
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s) {unknown}; known: {sorted(names)}")
    return cls(**d)


def _check_unpadded(attention_mask: Tensor | None) -> None:
    if attention_mask is not None and not bool(attention_mask.all()):
        raise ValueError("recurrent and bigram LMs do not support padded batches")


@dataclass
class LSTMConfig:
    """An LSTM language model. ``max_seq_len`` is the training window (generation slides it)."""

    vocab_size: int = 256
    max_seq_len: int = 128
    emb_dim: int = 128
    hidden: int = 256
    n_layers: int = 1
    dropout: float = 0.0
    tie_embeddings: bool = False  # needs emb_dim == hidden

    def __post_init__(self) -> None:
        check_field_types(
            self,
            ints=("vocab_size", "max_seq_len", "emb_dim", "hidden", "n_layers"),
            floats=("dropout",),
            bools=("tie_embeddings",),
        )
        for name in ("vocab_size", "max_seq_len", "emb_dim", "hidden", "n_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.tie_embeddings and self.emb_dim != self.hidden:
            raise ValueError(
                f"tie_embeddings needs emb_dim == hidden, got {self.emb_dim} and {self.hidden}"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LSTMConfig:
        return _from_dict(cls, d)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> LSTMConfig:
        presets = {
            "tiny": dict(emb_dim=32, hidden=64),
            "small": dict(emb_dim=128, hidden=256),
            "medium": dict(emb_dim=256, hidden=512, n_layers=2),
        }
        if name not in presets:
            raise ValueError(f"unknown LSTM preset {name!r}; choose from {sorted(presets)}")
        return cls.from_dict({**presets[name], **overrides})


class LSTMLM(nn.Module):
    """Embedding → multi-layer LSTM → linear head.

    Args:
        config: :class:`LSTMConfig`.
    """

    kind: ClassVar[str] = "lstm_lm"

    def __init__(self, config: LSTMConfig) -> None:
        super().__init__()
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.emb_dim)
        self.drop = nn.Dropout(c.dropout)
        self.lstm = nn.LSTM(
            c.emb_dim,
            c.hidden,
            num_layers=c.n_layers,
            batch_first=True,
            dropout=c.dropout if c.n_layers > 1 else 0.0,
        )
        self.lm_head = nn.Linear(c.hidden, c.vocab_size, bias=True)
        nn.init.normal_(self.tok_emb.weight, std=0.1)
        if c.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    def forward(
        self,
        idx: Tensor,
        *,
        attention_mask: Tensor | None = None,
        state: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """``idx (B, T)`` -> logits ``(B, T, V)``; ``state`` continues from an earlier chunk."""
        _check_unpadded(attention_mask)
        x = self.drop(self.tok_emb(idx))  # (B, T, E)
        h, _ = self.lstm(x, state)  # (B, T, Hd)
        return self.lm_head(self.drop(h))  # (B, T, V)


@dataclass
class BigramConfig:
    """A table of next-token logits indexed by the current token."""

    vocab_size: int = 256
    max_seq_len: int = 128

    def __post_init__(self) -> None:
        check_field_types(self, ints=("vocab_size", "max_seq_len"))
        if self.vocab_size < 1 or self.max_seq_len < 1:
            raise ValueError(
                f"vocab_size and max_seq_len must be positive, got "
                f"{self.vocab_size}, {self.max_seq_len}"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BigramConfig:
        return _from_dict(cls, d)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> BigramConfig:
        if name != "tiny":
            raise ValueError(f"unknown bigram preset {name!r}; choose from ['tiny']")
        return cls.from_dict(overrides)


class BigramLM(nn.Module):
    """``logits[b, t] = table[idx[b, t]]``: the next token depends on the current one only."""

    kind: ClassVar[str] = "bigram_lm"

    def __init__(self, config: BigramConfig) -> None:
        super().__init__()
        self.config = config
        self.table = nn.Embedding(config.vocab_size, config.vocab_size)  # (V, V) logits
        nn.init.zeros_(self.table.weight)  # start at the uniform distribution

    def forward(self, idx: Tensor, *, attention_mask: Tensor | None = None) -> Tensor:
        """``idx (B, T)`` -> logits ``(B, T, V)``."""
        _check_unpadded(attention_mask)
        return self.table(idx)


def _load_tokenizer(run_dir):
    from attnlab.data.tokenizers import load_tokenizer

    return load_tokenizer(run_dir)


register_kind(LSTMLM.kind, lambda d: LSTMLM(LSTMConfig.from_dict(d)), _load_tokenizer)
register_kind(BigramLM.kind, lambda d: BigramLM(BigramConfig.from_dict(d)), _load_tokenizer)
