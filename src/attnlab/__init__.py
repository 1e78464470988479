"""attnlab: the attention and Transformer family end to end.

Public names (imported lazily so ``import attnlab`` stays fast):

- ``attnlab.attention.scaled_dot_product_attention`` and the rest of :mod:`attnlab.attention`
- ``ModelConfig``, ``DecoderLM`` (decoder-only language models), ``generate``
- ``load(run_dir) -> (model, tokenizer)``
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "ModelConfig": "attnlab.config",
    "DecoderLM": "attnlab.models.lm",
    "load": "attnlab.runs",
    "scaled_dot_product_attention": "attnlab.attention.core",
}

# ``attnlab.generate`` is both a module and its main function: importing the function here binds
# the package attribute to the function for good (a later ``import attnlab.generate`` finds the
# module in sys.modules and leaves the attribute alone).
from attnlab.generate import generate  # noqa: E402

__all__ = [*_LAZY, "generate", "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'attnlab' has no attribute {name!r}")
