"""Read and edit activations at a model's hook points: ``run_with_cache`` and ``run_with_hooks``.

    logits, cache = run_with_cache(model, idx, names=["blocks.0.attn.hook_pattern"])
    cache["blocks.0.attn.hook_pattern"]                  # (B, H, T, T)
    logits = run_with_hooks(model, idx, hooks=[("blocks.0.hook_resid_post", fn)])

Only the chosen hook points get a hook, so memory holds only what was asked for, and a model run
without hooks takes its fast paths (fused attention, fused LayerNorm). ``inputs`` is what the
model's forward takes: a tensor, or a tuple of its positional arguments (``(src, src_mask,
tgt_in)`` for translation, ``(images, tokens)`` for captioning).

Shape legend: B batch, T time, H heads, D head dim, C d_model.
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Union

import torch
from torch import Tensor, nn

from attnlab.layers.hook import HookPoint, hook_points

__all__ = [
    "ActivationCache",
    "HookFn",
    "Names",
    "hooks",
    "list_hook_names",
    "resolve_names",
    "run_model",
    "run_with_cache",
    "run_with_hooks",
    "unknown_name",
]

#: a hook function: ``fn(activation, name)`` returns the replacement, or None to leave it
HookFn = Callable[[Tensor, str], Union[Tensor, None]]
#: which hook points: one name, a list of names, or a predicate on names (None: all)
Names = Union[str, Sequence[str], Callable[[str], bool], None]


def list_hook_names(model: nn.Module) -> list[str]:
    """Every hook name of ``model``, in module order."""
    return list(hook_points(model))


def unknown_name(name: str, known: Sequence[str]) -> ValueError:
    """The error for an unknown hook name, naming the closest known ones."""
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return ValueError(
        f"unknown hook name {name!r}{hint} (this model has {len(known)} hook points; "
        "attnlab.inspect.list_hook_names(model) lists them)"
    )


def resolve_names(points: Mapping[str, HookPoint], names: Names) -> list[str]:
    """The hook names that ``names`` selects among ``points``.

    Raises:
        ValueError: a name the model does not have (with the closest ones), or a predicate that
            selects nothing.
    """
    known = list(points)
    if names is None:
        return known
    if callable(names):
        chosen = [n for n in known if names(n)]
        if not chosen:
            raise ValueError("the names predicate selects no hook point of this model")
        return chosen
    if isinstance(names, str):
        names = [names]
    for name in names:
        if name not in points:
            raise unknown_name(name, known)
    return list(dict.fromkeys(names))


def run_model(model: nn.Module, inputs: Any, **kwargs: Any) -> Any:
    """``model(*inputs, **kwargs)`` for a tuple, ``model(inputs, **kwargs)`` otherwise."""
    if isinstance(inputs, tuple):
        return model(*inputs, **kwargs)
    return model(inputs, **kwargs)


@contextlib.contextmanager
def hooks(model: nn.Module, hooks: Sequence[tuple[Names, HookFn]]) -> Iterator[None]:
    """Attach ``hooks`` (``(names, fn)`` pairs) for the ``with`` block, then remove them.

    ``fn(activation, name)`` returns the new activation (same shape) or None to keep it.

    Raises:
        ValueError: an unknown hook name; a hook returning a tensor of another shape (raised
            from the forward).
    """
    points = hook_points(model)
    handles = []
    try:
        for names, fn in hooks:
            for name in resolve_names(points, names):
                handles.append(points[name].register_forward_hook(_edit(name, fn)))
        yield
    finally:
        for h in handles:
            h.remove()


def _edit(name: str, fn: HookFn):
    def hook(module: nn.Module, args: tuple, out: Tensor) -> Tensor | None:
        new = fn(out, name)
        if new is None:
            return None
        if not isinstance(new, Tensor):
            raise ValueError(
                f"the hook on {name!r} returned {type(new).__name__}; return a tensor or None"
            )
        if new.shape != out.shape:
            raise ValueError(
                f"the hook on {name!r} returned shape {tuple(new.shape)}; the activation has "
                f"shape {tuple(out.shape)} and a replacement must keep it"
            )
        return new

    return hook


class ActivationCache(Mapping):
    """Activations by hook name: ``cache[name]`` is the tensor of that point's last call.

    A point called several times in one forward (a Bahdanau decoder's attention at every step, a
    position table shared by encoder and decoder) keeps every call: ``cache.calls(name)``, and
    ``cache.stacked(name, dim)`` joins them.
    """

    def __init__(self) -> None:
        self._calls: dict[str, list[Tensor]] = {}

    def add(self, name: str, value: Tensor) -> None:
        self._calls.setdefault(name, []).append(value)

    def __getitem__(self, name: str) -> Tensor:
        if name not in self._calls:
            raise unknown_name(name, list(self._calls)) if self._calls else KeyError(name)
        return self._calls[name][-1]

    def __iter__(self) -> Iterator[str]:
        return iter(self._calls)

    def __len__(self) -> int:
        return len(self._calls)

    def calls(self, name: str) -> list[Tensor]:
        """Every call of hook point ``name`` in the forward, first first."""
        self[name]  # noqa: B018 (the error for an unknown name)
        return list(self._calls[name])

    def stacked(self, name: str, dim: int = 1) -> Tensor:
        """The calls of ``name`` concatenated along ``dim`` (per-step activations -> one)."""
        return torch.cat(self.calls(name), dim=dim)

    def __repr__(self) -> str:
        return f"ActivationCache({len(self)} hook points: {list(self._calls)[:6]}...)"


def run_with_cache(
    model: nn.Module,
    inputs: Any,
    names: Names = None,
    *,
    detach: bool = True,
    **kwargs: Any,
) -> tuple[Any, ActivationCache]:
    """Run the model and keep the activations of the chosen hook points.

    Args:
        model: any attnlab model (its hook points are found by module path).
        inputs: a tensor, or a tuple of the forward's positional arguments.
        names: a name, a list of names, or a predicate on names; None = every hook point.
        detach: store detached tensors (default; False keeps the graph for gradients).
        **kwargs: keyword arguments for the forward.

    Returns:
        ``(output, cache)``: what the forward returned, and an :class:`ActivationCache`.

    Raises:
        ValueError: an unknown hook name (the message lists the closest ones).
    """
    cache = ActivationCache()

    def keep(act: Tensor, name: str) -> None:
        cache.add(name, act.detach() if detach else act)

    with hooks(model, [(names, keep)]):
        out = run_model(model, inputs, **kwargs)
    return out, cache


def run_with_hooks(
    model: nn.Module,
    inputs: Any,
    hooks: Sequence[tuple[Names, HookFn]] = (),
    **kwargs: Any,
) -> Any:
    """Run the model with ``hooks`` (``(names, fn)`` pairs) editing activations; return its output.

    ``fn(activation, name)`` returns the new activation (same shape), or None to leave it.

    Raises:
        ValueError: an unknown hook name, or a hook that returns another shape.
    """
    with _hooks(model, hooks):
        return run_model(model, inputs, **kwargs)


_hooks = hooks
