"""Interoperability with other libraries' checkpoints: Hugging Face folders in and out.

``from_hf(path) -> model`` and ``to_hf(model, path)``; see :mod:`attnlab.interop.hf`.
"""

from attnlab.interop.hf import (
    SUPPORTED_ARCHITECTURES,
    from_hf,
    load_hf_lm,
    load_hf_tokenizer,
    read_hf_config,
    to_hf,
)

__all__ = [
    "from_hf",
    "to_hf",
    "load_hf_tokenizer",
    "load_hf_lm",
    "read_hf_config",
    "SUPPORTED_ARCHITECTURES",
]
