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
kernels (the first compile takes tens of seconds; later runs reuse the on-disk cache), and the
compiled step is kept per model: Dynamo's checks of the model's attributes and of globals before
every call (0.7 ms of a step) are replaced by one comparison of the model's structure per
generation (:func:`compiled_forward`).

Capacities are rounded up to a power of two, and above 512 to a quarter of the octave
(:func:`capacity_bucket`: 640, 768, 896, 1024, 1280, ...), so prompts of many lengths share a
handful of compiled graphs while a long prompt attends over at most a quarter more slots than it
fills (every step reads the whole static cache: 1,024 slots for a 544-token context cost 1.6x
640).

Shape legend: B batch, V vocab.
"""

from __future__ import annotations

import inspect
import itertools
import weakref
from collections.abc import Callable

import torch
from torch import Tensor, nn

from attnlab.attention.cache import DecodeState
from attnlab.errors import UserError

__all__ = [
    "supports_static",
    "capacity_bucket",
    "compiled_forward",
    "start_static",
    "CompiledDecoder",
    "compiled_greedy_draft",
    "DRAFT_CHUNK",
]

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


#: per model: (what its compiled CPU step depends on, the compiled step)
_CPU_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_STEP_IDS = itertools.count()


def _structure(model: nn.Module) -> tuple:
    """What a compiled step's graph depends on besides the values of its inputs: the module tree
    (types, train/eval flags, forward hooks), every parameter's and buffer's dtype, shape, layout
    and device, and the configuration."""
    tensors = itertools.chain(model.named_parameters(), model.named_buffers())
    modules = model.named_modules()
    return (
        repr(getattr(model, "config", None)),
        tuple(
            (name, type(m), m.training, tuple(m._forward_pre_hooks), tuple(m._forward_hooks))
            for name, m in modules
        ),
        tuple(
            (name, t.dtype, tuple(t.shape), t.stride(), t.device, t.requires_grad)
            for name, t in tensors
        ),
    )


def _own_function(source: str, name: str) -> Callable[..., Tensor]:
    """The function ``name`` defined by ``source``, with a code object of its own. Dynamo keeps
    compiled graphs and their guards per code object, so a function per model keeps each
    model's graphs its own."""
    namespace: dict = {}
    exec(compile(source, f"<attnlab decoding {name} {next(_STEP_IDS)}>", "exec"), namespace)
    return namespace[name]


# the compiled single-token step
_STEP_SOURCE = "def step(model, idx, kwargs):\n    return model(idx, **kwargs)\n"


# k greedy steps in one graph: each feeds the token before and keeps the argmax of its logits
_DRAFT_SOURCE = """\
import torch

def drafts(model, idx, caches, k):
    out = []
    for _ in range(k):
        logits = model(idx, caches=caches, attention_mask=None, logits_to_keep=1)
        idx = logits[:, -1].argmax(dim=-1, keepdim=True)
        out.append(idx)
    return torch.cat(out, dim=1)
"""


def _guards_not_on_the_model(entries) -> list[bool]:
    # Before every call Dynamo checks hundreds of guards on the model's attributes (module types,
    # flags, parameter metadata) and on the globals the forward read (module constants, the
    # backend registry): 0.7 ms of an 8.6 ms step for GPT-2 6 x 384 on a CPU, 0.04 ms without
    # them. The step's graphs belong to one model, whose _structure is compared once per
    # generation instead, and the globals are the library's own; the guards on the inputs
    # (token ids, caches, mask) and on the global state (grad mode) stay.
    return [not _on_the_model_or_global(entry.name) for entry in entries]


def _on_the_model_or_global(source: str) -> bool:
    # Dynamo names a guard by the source it reads: model, model._modules['blocks'], ...,
    # dict(type(model)...) for the class dictionaries it consults, G['...'] for globals
    return source == "model" or source.startswith(("model.", "model[", "dict(type(model", "G["))


def _raise_recompile_limit() -> None:
    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = max(limit, RECOMPILE_LIMIT)


def _kept(kept: weakref.WeakKeyDictionary, model: nn.Module, source: str, name: str):
    """``model``'s compiled function ``name`` (from ``source``) in ``kept``: compiled anew when
    the model's structure changed (:func:`_structure`, compared here once instead of Dynamo's
    guards on the model before every call)."""
    key = _structure(model)
    entry = kept.get(model)
    if entry is None or entry[0] != key:
        entry = (key, _compile_step(_own_function(source, name)))
        kept[model] = entry
    return entry[1]


def _compile_step(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """``fn`` (a function of its own per model) compiled for a CPU, without the guards on the
    model's attributes (:func:`_guards_not_on_the_model`), rounding every bf16/fp16
    intermediate as eager code does (``emulate_precision_casts``): inductor otherwise keeps a
    fused chain of element-wise ops in fp32, and how it fuses depends on the number of tokens,
    so a verification's rows and a one-token step rounded apart (1-2 bf16 units in every logit
    of a 4 x 256 bf16 LM, which flipped greedy near-ties)."""
    options = {"guard_filter_fn": _guards_not_on_the_model, "emulate_precision_casts": True}
    return torch.compile(fn, dynamic=False, options=options)


def compiled_forward(model: nn.Module, *, mode: str | None = "auto") -> Callable[..., Tensor]:
    """``model``'s forward compiled for single-token steps over static caches.

    On a CPU the compiled step is kept per model and reused while the model's structure (module
    types and modes, parameter dtypes, shapes and devices, configuration) is unchanged; it skips
    Dynamo's per-call guards on the model's attributes (checked once here instead), keeping
    those on the step's inputs. A changed model compiles anew.

    Args:
        model: a :class:`~attnlab.DecoderLM` (in eval mode).
        mode: ``torch.compile`` mode; ``auto``: ``reduce-overhead`` (CUDA graphs) on a GPU, the
            default mode on a CPU.

    Returns:
        A callable ``step(idx, **forward_kwargs)`` running the compiled forward.
    """
    if mode == "auto":
        mode = "reduce-overhead" if _device_type(model) == "cuda" else None
    _raise_recompile_limit()
    graphs = mode == "reduce-overhead"
    if mode is None and _device_type(model) == "cpu":
        own_step = _kept(_CPU_STEPS, model, _STEP_SOURCE, "step")

        def compiled(idx: Tensor, **kwargs) -> Tensor:
            return own_step(model, idx, kwargs)

    else:
        # Dynamo caches what it compiles on the forward's code object, guarded on the model
        compiled = torch.compile(model, mode=mode, dynamic=False)

    def step(idx: Tensor, **kwargs) -> Tensor:
        # the new tokens are often a column sliced from a growing (B, L) tensor, whose row stride
        # changes every step: give the graph the same (contiguous) layout every time
        idx = idx.clone(memory_format=torch.contiguous_format)
        if not graphs:
            return compiled(idx, **kwargs)
        torch.compiler.cudagraph_mark_step_begin()  # the previous step's outputs are consumed
        return compiled(idx, **kwargs).clone()  # the next replay overwrites the graph's output

    return step


#: the most greedy draft steps one compiled graph unrolls (k = 8 + 4 + 1 takes three calls). A
#: graph's first compile grows with its steps (a 1 x 128 draft on a CPU, cold: 2, 8, 14, 28, 60 s
#: for 1, 2, 4, 8, 16 steps), its call overhead does not (about 0.1 ms of a 0.15 ms step)
DRAFT_CHUNK = 8

#: per model: (its structure, the compiled k-step function)
_CPU_DRAFTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def compiled_greedy_draft(model: nn.Module) -> Callable[[Tensor, list, int], Tensor]:
    """``drafts(idx, caches, k)``: ``k`` greedy tokens from ``model`` over its static caches,
    several single-token steps per compiled call.

    Each step feeds the token before (``idx (1, 1)`` first, then each argmax) and keeps the
    argmax of its logits: the steps of :func:`compiled_forward`, without a call, a device
    sync and Python's work per token (a 1 x 128 draft on a CPU: 0.05 ms a token against 0.15).
    ``k`` is split into powers of two of at most :data:`DRAFT_CHUNK` steps, one graph each;
    the caches' cursors advance by ``k``. The graphs are kept per model as
    :func:`compiled_forward` keeps its CPU step (the model's structure is compared here, once,
    instead of Dynamo's guards on it before every call). Made for a CPU: on a GPU speculative
    decoding takes :func:`compiled_forward`'s CUDA-graph steps one by one.

    Args:
        model: a :class:`~attnlab.DecoderLM` (eval mode) without padding in its caches.

    Returns:
        ``drafts(idx (1, 1), caches, k) -> (1, k)`` token ids.
    """
    _raise_recompile_limit()
    chunked = _kept(_CPU_DRAFTS, model, _DRAFT_SOURCE, "drafts")

    def drafts(idx: Tensor, caches: list, k: int) -> Tensor:
        idx = idx.clone(memory_format=torch.contiguous_format)
        out = []
        while k > 0:
            n = min(DRAFT_CHUNK, 1 << (k.bit_length() - 1))  # the largest power of two <= k
            out.append(chunked(model, idx, caches, n))
            idx, k = out[-1][:, -1:], k - n
        return torch.cat(out, dim=1)

    return drafts


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


class CompiledDecoder(nn.Module):
    """A language model whose decoding runs over static KV caches with a compiled step
    (:func:`start_static` with ``compile=True``; capacities rounded by :func:`capacity_bucket`).

    It implements the decoding interface (``start_decoding`` / ``decode_step``) and forwards
    everything else to ``model``, so :func:`attnlab.decoding.generate` takes it as it takes the
    model. Made by :func:`attnlab.fast.for_decoding` with ``compile=True``.

    Args:
        model: a :class:`~attnlab.DecoderLM` (static caches).

    Raises:
        UserError: a model without static caches.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        if not supports_static(model):
            raise UserError(
                f"{type(model).__name__} has no static KV cache: compiled decoding needs a "
                "Transformer LM (DecoderLM)"
            )
        self.model = model

    @property
    def config(self):
        """The model's configuration."""
        return self.model.config

    def forward(self, idx: Tensor, **kwargs) -> Tensor:
        """The model's forward (eager)."""
        return self.model(idx, **kwargs)

    def start_decoding(self, batch_size: int, max_len: int | None = None) -> DecodeState:
        """A static state for ``batch_size`` rows and at least ``max_len`` tokens, whose
        single-token steps run the compiled forward."""
        ctx = self.model.config.max_seq_len
        capacity = capacity_bucket(ctx if max_len is None else max_len, ctx)
        return start_static(self.model, batch_size, capacity, compile=True)

    def decode_step(
        self, tokens: Tensor, state: DecodeState, **kwargs
    ) -> tuple[Tensor, DecodeState]:
        """The model's ``decode_step`` (the state carries the compiled step)."""
        return self.model.decode_step(tokens, state, **kwargs)
