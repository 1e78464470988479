"""A decoding step without Python overhead per layer: ``torch.compile`` over static KV caches.

Batch-1 decoding reads every weight once per token; at small sizes the Python work of walking the
blocks (dozens of small ops per layer) costs as much as the arithmetic. Compiling the model's
forward removes it, but only pays when the compiled graph is reused: every single-token step must
have the same shapes. A *static* decoding state (:meth:`attnlab.DecoderLM.start_decoding` with
``static=True``) gives exactly that: the KV caches are preallocated, each step writes its keys at a
cursor tensor and attends over every slot with a mask, so step 1 and step 1000 are the same graph.

    state = start_static(model, batch_size, capacity, compile=True)
    logits, state = model.decode_step(prompt, state)        # prefill: eager (any length)
    logits, state = model.decode_step(next_token, state)    # (B, 1): the compiled graph

On a GPU the step is compiled with ``mode="reduce-overhead"`` (CUDA graphs: one launch per token);
the cache buffers are marked static so the graph replays in place. On a CPU inductor generates C++
kernels (the first compile takes tens of seconds; later runs reuse the on-disk cache).

Capacities are rounded up to a power of two, and above 512 to a quarter of the octave
(:func:`capacity_bucket`: 640, 768, 896, 1024, 1280, ...), so prompts of many lengths share a
handful of compiled graphs while a long prompt attends over at most a quarter more slots than it
fills (every step reads the whole static cache: 1,024 slots for a 544-token context cost 1.6x
640).

Shape legend: B batch, V vocab.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from torch import Tensor, nn

from attnlab.attention.cache import DecodeState
from attnlab.errors import UserError

__all__ = ["supports_static", "capacity_bucket", "compiled_forward", "start_static"]

_MIN_BUCKET = 64
#: above this capacity buckets are quarter octaves, not powers of two
_FINE_FROM = 512
#: compiled graphs kept per code object: each (model shape, dtype, capacity) is one graph, and
#: torch's default of 8 would silently fall back to eager after a few benchmark settings
RECOMPILE_LIMIT = 64


def supports_static(model: nn.Module) -> bool:
    """True when ``model.start_decoding`` takes ``static=True`` (the :class:`~attnlab.DecoderLM`)."""
    start = getattr(model, "start_decoding", None)
    return callable(start) and "static" in inspect.signature(start).parameters


def capacity_bucket(needed: int, limit: int) -> int:
    """The capacity to allocate for ``needed`` tokens, at most ``limit`` (the context): the next
    power of two (at least 64) up to 512, then the next multiple of an eighth of the next power
    of two (640, 768, 896, 1024, 1280, ...). Few distinct capacities = few compiled graphs (at
    most four per doubling), and above 512 at most a quarter of the slots unused."""
    cap = _MIN_BUCKET
    while cap < needed:
        cap *= 2
    if cap > _FINE_FROM:
        step = cap // 8
        cap = -(-needed // step) * step
    return min(cap, limit)


def _device_type(model: nn.Module) -> str:
    return next(model.parameters()).device.type


def compiled_forward(model: nn.Module, *, mode: str | None = "auto") -> Callable[..., Tensor]:
    """``model``'s forward compiled for single-token steps over static caches.

    Args:
        model: a :class:`~attnlab.DecoderLM` (in eval mode).
        mode: ``torch.compile`` mode; ``auto``: ``reduce-overhead`` (CUDA graphs) on a GPU, the
            default mode on a CPU.

    Returns:
        A callable ``step(idx, **forward_kwargs)`` running the compiled forward.
    """
    if mode == "auto":
        mode = "reduce-overhead" if _device_type(model) == "cuda" else None
    # Dynamo caches what it compiles on the forward's code object, so a new wrapper (or another
    # model of the same shapes) reuses the graph: nothing needs keeping here
    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = max(limit, RECOMPILE_LIMIT)
    compiled = torch.compile(model, mode=mode, dynamic=False)
    graphs = mode == "reduce-overhead"

    def step(idx: Tensor, **kwargs) -> Tensor:
        # the new tokens are often a column sliced from a growing (B, L) tensor, whose row stride
        # changes every step: give the graph the same (contiguous) layout every time
        idx = idx.clone(memory_format=torch.contiguous_format)
        if not graphs:
            return compiled(idx, **kwargs)
        torch.compiler.cudagraph_mark_step_begin()  # the previous step's outputs are consumed
        return compiled(idx, **kwargs).clone()  # the next replay overwrites the graph's output

    return step


def start_static(
    model: nn.Module,
    batch_size: int,
    capacity: int,
    *,
    compile: bool = False,
    mode: str | None = "auto",
) -> DecodeState:
    """A static decoding state for ``batch_size`` rows and ``capacity`` tokens (prompt included).

    Args:
        compile: run single-token steps through :func:`compiled_forward`.
        mode: its ``torch.compile`` mode.

    Raises:
        UserError: a model without static caches.
    """
    if not supports_static(model):
        raise UserError(
            f"{type(model).__name__} has no static KV cache: compiled decoding needs a "
            "Transformer LM (DecoderLM)"
        )
    state = model.start_decoding(batch_size, capacity, static=True)
    if compile:
        state.step_forward = compiled_forward(model, mode=mode)
        if _device_type(model) == "cuda":
            # CUDA graphs replay fixed addresses: the buffers written in place must stay put
            for cache in state.caches:
                for buf in (cache.k, cache.v, cache.cursor):
                    torch._dynamo.mark_static_address(buf)
            torch._dynamo.mark_static_address(state.mask)
    return state
