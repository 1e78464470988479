"""The incremental-decoding interface every model that generates implements.

    state = model.start_decoding(...)                   # encode the source / image once, allocate
                                                        # KV caches (LM: start_decoding(B, max_len))
    logits, state = model.decode_step(tokens, state)    # feed tokens (B, T): the prompt or <start>
                                                        # first, then one token per step;
                                                        # logits (B, V) of the next token
    state = state.reorder(index)                        # keep rows `index` (beam search)

The LM (:class:`attnlab.DecoderLM`), the RNN and Transformer seq2seq models and both captioners
implement it, so greedy decoding, sampling and beam search (:mod:`attnlab.decoding.search`,
:mod:`attnlab.decoding.sampling`) are written once. A state is a :class:`DecodeState` (from
:mod:`attnlab.attention.cache`): a dataclass whose tensors are batched along dimension 0 and whose
KV caches reorder themselves.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from torch import Tensor

from attnlab.attention.cache import DecodeState

__all__ = ["IncrementalDecoder", "DecodeState", "supports_decoding"]


@runtime_checkable
class IncrementalDecoder(Protocol):
    """A model that decodes one step at a time (see the module docstring)."""

    def start_decoding(self, *args: Any, **kwargs: Any) -> DecodeState: ...

    def decode_step(
        self, tokens: Tensor, state: DecodeState, **kwargs: Any
    ) -> tuple[Tensor, DecodeState]: ...


def supports_decoding(model: Any) -> bool:
    """True when ``model`` implements :class:`IncrementalDecoder`."""
    return callable(getattr(model, "start_decoding", None)) and callable(
        getattr(model, "decode_step", None)
    )
