"""A config checked against its weights before anything is allocated.

A checkpoint is a config (``config.json`` of a run directory or a Hugging Face folder) and the
weights beside it. The config says how big the model is; the safetensors header says how big the
weights are: names, dtypes and shapes, read without any tensor data. Both come from elsewhere and
either may lie, so every loader takes the same steps before it builds anything real:

1. :func:`read_header`: the weights' names and shapes (a missing or unreadable file is refused
   here, so a config with no weights beside it is never built);
2. :func:`build_on_meta`: the model the config describes, built on the ``meta`` device (shapes,
   no storage) within bounds taken from the header's ``K`` tensors of ``N`` values: no
   layer-count field (``n_layers``, ``num_hidden_layers``, ``depths``...) above ``K``; at most
   ``4 K + 64`` parameter and buffer tensors and ``16 K + 256`` modules created; at most
   ``2 N + 2**24`` values in the finished model's parameters and buffers;
3. :func:`compare`: the model's tensor names and shapes against the header's.

Each refusal is one :class:`~attnlab.errors.UserError` line naming the first few tensors and, where
one explains them, the config field: ``config says n_embd=2000000; the weights have 16``.
:func:`explain` finds such fields among the config's integers (a value equal to, or dividing, a
mismatched dimension; a layer count that differs from the weights') and keeps a candidate only
when a meta rebuild with the weights' value makes the tensors fit better.
"""

from attnlab.checkpoint_check import meta
from attnlab.checkpoint_check.explain import explain, flat_ints
from attnlab.checkpoint_check.meta import *  # noqa: F403  (the names of meta.__all__)

__all__ = [*meta.__all__, "explain", "flat_ints"]
