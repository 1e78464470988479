"""Interoperability with other libraries' checkpoints: Hugging Face folders in and out.

``from_hf(path) -> model`` and ``to_hf(model, path)``, plus ``load_hf_lm``, ``load_hf_tokenizer``,
``read_hf_config`` and ``SUPPORTED_ARCHITECTURES``: the API of :mod:`attnlab.interop.hf`. Every
conversion is a declarative key map (:mod:`attnlab.interop.keymap`) read in both directions.
"""

from attnlab.interop.hf import *  # noqa: F403 (this package's API is attnlab.interop.hf's)
from attnlab.interop.hf import __all__  # noqa: F401
