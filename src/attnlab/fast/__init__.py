"""Fast paths, applied on request: explicit transforms of a plain model.

The models of attnlab are built from ``nn.Linear``, the attention formula and dynamic KV caches,
and read like the lecture. What makes them fast on a CPU lives here, and is applied only when
asked for (``attnlab generate --dtype/--quantize/--compile``, the LM task's loss, the
benchmarks):

- :func:`for_decoding`: a model for generation: a dtype, weight-only int8
  (:mod:`~attnlab.fast.quant`), the one-row matrix-vector kernel (:mod:`~attnlab.fast.matvec`,
  built the first time a one-row product runs), fp32 products for one query
  (:mod:`~attnlab.fast.attention`, the ``decode`` backend) and, with ``compile=True``, static
  KV caches with a compiled step (:mod:`~attnlab.fast.compiled`);
- :class:`FusedLMLoss` (:mod:`~attnlab.fast.loss`): the output projection and the cross-entropy
  in one step, which the LM task passes to the model's forward.

Nothing in ``attnlab.models``, ``attnlab.layers`` or ``attnlab.attention`` imports this package
(the import contract in ``pyproject.toml`` keeps it so).
"""

from __future__ import annotations

import torch
from torch import nn

from attnlab.fast.attention import decode_attention
from attnlab.fast.compiled import (
    CompiledDecoder,
    capacity_bucket,
    compiled_forward,
    compiled_greedy_draft,
    start_static,
    supports_static,
)
from attnlab.fast.loss import FusedLMLoss, LinearCEBuffer, linear_cross_entropy
from attnlab.fast.matvec import matvec_available, use_matvec
from attnlab.fast.quant import Int8Linear, int8_error_bound, quantize_int8

__all__ = [
    "for_decoding",
    "FusedLMLoss",
    "CompiledDecoder",
    "Int8Linear",
    "LinearCEBuffer",
    "capacity_bucket",
    "compiled_forward",
    "compiled_greedy_draft",
    "decode_attention",
    "int8_error_bound",
    "linear_cross_entropy",
    "matvec_available",
    "quantize_int8",
    "start_static",
    "supports_static",
    "use_matvec",
]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def for_decoding(
    model: nn.Module,
    *,
    dtype: torch.dtype | str | None = None,
    quantize: str | None = None,
    compile: bool = False,
    matvec: bool = True,
) -> nn.Module:
    """Prepare ``model`` (a :class:`attnlab.DecoderLM`) for fast generation, in place.

    In this order: floating-point parameters to ``dtype``; ``quantize="int8"``: every linear
    layer to :class:`Int8Linear`; ``matvec``: the remaining ``nn.Linear`` layers take the
    one-row kernel for single rows (:func:`use_matvec`; built at the first one-row product);
    attention over one query through fp32 products (:func:`decode_attention`); eval mode.
    State-dict names do not change.

    Args:
        dtype: ``torch.float32`` / ``torch.bfloat16`` (or their names); None keeps the model's.
        quantize: None or ``"int8"`` (weight-only, per-channel scales).
        compile: decode over static KV caches with a ``torch.compile``'d single-token step
            (CUDA graphs on a GPU): the result is a :class:`CompiledDecoder` around ``model``.
        matvec: use the one-row CPU kernel (off: ``F.linear`` for every product).

    Returns:
        ``model``, or with ``compile`` a :class:`CompiledDecoder` holding it; either goes to
        :func:`attnlab.decoding.generate`.

    Raises:
        ValueError: an unknown dtype or quantisation.
    """
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; choose from {sorted(_DTYPES)}")
        dtype = _DTYPES[dtype]
    if quantize not in (None, "int8"):
        raise ValueError(f"unknown quantization {quantize!r}; choose from ['int8']")
    if dtype is not None:  # parameters only: buffers (RoPE's frequencies) keep theirs
        for p in filter(torch.is_floating_point, model.parameters()):
            p.data = p.data.to(dtype)
    if quantize == "int8":
        quantize_int8(model)
    if matvec:
        use_matvec(model)
    decode_attention(model).eval()
    return CompiledDecoder(model) if compile else model
