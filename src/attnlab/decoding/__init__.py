"""attnlab.decoding: one decoding implementation for every model that generates.

- :mod:`~attnlab.decoding.interface`: ``start_decoding`` / ``decode_step`` / ``state.reorder``,
  implemented by the LM, the seq2seq models and the captioners;
- :mod:`~attnlab.decoding.search`: greedy decoding and batched beam search (GNMT length penalty);
- :mod:`~attnlab.decoding.sampling`: sampling from LMs (temperature, top-k, top-p, stop ids,
  streaming, left-padded batches) and LM beam search;
- a compiled single-token step over static KV caches (:mod:`attnlab.fast.compiled`), re-exported;
- :mod:`~attnlab.decoding.text`: prompts, end-of-text ids, stop texts and streaming text
  (``attnlab generate``).
- :mod:`~attnlab.decoding.speculative`, :mod:`~attnlab.decoding.lookup`: speculative decoding
  with a draft model or prompt lookup (``generate(..., draft=..., prompt_lookup=...)``).
"""

from attnlab.decoding.interface import DecodeState, IncrementalDecoder, supports_decoding
from attnlab.decoding.sampling import (
    beam_generate,
    generate,
    left_pad,
    sample_next,
    stream_generate,
)
from attnlab.decoding.search import Hypothesis, beam_search, greedy_search, length_penalty
from attnlab.decoding.speculative import SpeculativeStats
from attnlab.fast.compiled import compiled_forward, start_static

__all__ = [
    "DecodeState",
    "IncrementalDecoder",
    "supports_decoding",
    "generate",
    "stream_generate",
    "sample_next",
    "left_pad",
    "beam_generate",
    "Hypothesis",
    "beam_search",
    "greedy_search",
    "length_penalty",
    "compiled_forward",
    "start_static",
    "SpeculativeStats",
]
