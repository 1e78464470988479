"""Hugging Face checkpoint folders in and out: ``from_hf(path) -> model``, ``to_hf(model, path)``.

- :mod:`~attnlab.interop.hf.api`: ``from_hf``, ``to_hf``, ``load_hf_lm`` over every family;
- :mod:`~attnlab.interop.hf.checkpoint`: the files (config.json, safetensors single or sharded,
  tokenizer.json, generation_config.json);
- :mod:`~attnlab.interop.hf.family`: what a family provides and the one conversion path;
- one module per family, each a declarative key map (:mod:`attnlab.interop.keymap`) plus config
  translation both ways: :mod:`~attnlab.interop.hf.lm` (GPT-2, Llama, Mixtral),
  :mod:`~attnlab.interop.hf.vision` (ViT, Swin), :mod:`~attnlab.interop.hf.deit` (DeiT),
  :mod:`~attnlab.interop.hf.bert` (BERT).
"""

from attnlab.interop.hf.api import SUPPORTED_ARCHITECTURES, from_hf, load_hf_lm, to_hf
from attnlab.interop.hf.checkpoint import (
    HF_GENERATION_KEYS,
    TOKENIZER_NAME,
    load_hf_tokenizer,
    read_hf_config,
    read_hf_weights,
)

__all__ = [
    "from_hf",
    "to_hf",
    "load_hf_tokenizer",
    "load_hf_lm",
    "read_hf_config",
    "read_hf_weights",
    "SUPPORTED_ARCHITECTURES",
    "HF_GENERATION_KEYS",
    "TOKENIZER_NAME",
]
