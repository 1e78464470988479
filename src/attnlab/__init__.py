"""attnlab: the attention and Transformer family end to end.

Public names (imported lazily so ``import attnlab`` stays fast and imports no layer):

- ``attnlab.attention.scaled_dot_product_attention`` and the rest of :mod:`attnlab.attention`
- ``ModelConfig``, ``DecoderLM`` (decoder-only language models), ``generate``
- ``load(run_dir) -> (model, tokenizer)`` for every kind of run
"""

from __future__ import annotations

import importlib

__version__ = "0.2.0"

_LAZY = {
    "ModelConfig": "attnlab.config",
    "DecoderLM": "attnlab.models.lm",
    "load": "attnlab.runs",
    "generate": "attnlab.decoding",
    "scaled_dot_product_attention": "attnlab.attention.core",
}

__all__ = [*_LAZY, "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'attnlab' has no attribute {name!r}")
