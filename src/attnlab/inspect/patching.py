"""Activation patching: run a corrupted input with some activations taken from a clean run.

    clean, corrupted = ids_a, ids_b                  # same shapes, e.g. one token changed
    effect = patch_positions(model, clean, corrupted, metric)         # (L, T)
    effect = patch_heads(model, clean, corrupted, metric)             # (L, H)

``metric(output)`` turns the model's output into a number (a logit difference, a loss). Entry
``[l, p]`` is the metric of the corrupted run with block ``l``'s activation at position ``p``
replaced by the clean run's (``[l, h]``: head ``h``'s). Patching every position of a hook point
restores the clean output exactly when that point carries everything downstream (the residual
stream), which the tests check.

Shape legend: B batch, T time (positions), H heads, D head dim, C d_model, L blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.inspect.families import stack_of
from attnlab.inspect.hooks import ActivationCache, HookFn, hooks, run_model, run_with_cache

__all__ = ["check_same_shapes", "patch", "patch_heads", "patch_positions"]

Metric = Callable[[Any], Tensor | float]

_POSITION_HOOKS = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")
_HEAD_HOOKS = {"z": -2, "q": -2, "k": -2, "v": -2, "pattern": 1, "attn_scores": 1}


def _as_tuple(inputs: Any) -> tuple:
    return inputs if isinstance(inputs, tuple) else (inputs,)


def check_same_shapes(clean: Any, corrupted: Any) -> None:
    """Raise unless ``clean`` and ``corrupted`` are inputs of the same shapes.

    Raises:
        ValueError: a different number of inputs, or an input whose shape differs (different
            lengths cannot be patched position by position).
    """
    a, b = _as_tuple(clean), _as_tuple(corrupted)
    if len(a) != len(b):
        raise ValueError(
            f"patching needs clean and corrupted inputs of the same form; got {len(a)} and "
            f"{len(b)} inputs"
        )
    for i, (x, y) in enumerate(zip(a, b)):
        if isinstance(x, Tensor) != isinstance(y, Tensor):
            raise ValueError(f"patching: input {i} is a tensor in one run and not in the other")
        if isinstance(x, Tensor) and x.shape != y.shape:
            raise ValueError(
                f"patching needs clean and corrupted inputs of the same shape; input {i} is "
                f"{tuple(x.shape)} clean and {tuple(y.shape)} corrupted (pad them to one length)"
            )


def patch(
    model: nn.Module,
    clean: Any,
    corrupted: Any,
    names: Sequence[str],
    *,
    index: Callable[[str], Any] | None = None,
) -> Any:
    """The output of the corrupted run with the hook points ``names`` patched from the clean run.

    Args:
        names: hook names to patch.
        index: ``index(name)`` -> the part of the activation to patch (an index tuple such as
            ``(slice(None), 3)`` for position 3); default: all of it.

    A hook point called several times in one forward (a Bahdanau decoder's steps) is patched
    call by call.
    """
    check_same_shapes(clean, corrupted)
    with torch.no_grad():
        _, cache = run_with_cache(model, clean, names=list(names))
    return _patched_run(model, cache, corrupted, names, index)


def _patched_run(
    model: nn.Module,
    cache: ActivationCache,
    corrupted: Any,
    names: Sequence[str],
    index: Callable[[str], Any] | None,
) -> Any:
    counters = dict.fromkeys(names, 0)

    def fn(act: Tensor, name: str) -> Tensor:
        calls = cache.calls(name)
        src = calls[min(counters[name], len(calls) - 1)]
        counters[name] += 1
        if src.shape != act.shape:
            raise ValueError(
                f"patching {name!r}: clean activation {tuple(src.shape)} and corrupted "
                f"{tuple(act.shape)} differ"
            )
        if index is None:
            return src.clone()
        out = act.clone()
        where = index(name)
        out[where] = src[where]
        return out

    hook_list: list[tuple[str, HookFn]] = [(n, fn) for n in names]
    with torch.no_grad(), hooks(model, hook_list):
        return run_model(model, corrupted)


def _metric(metric: Metric, out: Any) -> float:
    value = metric(out)
    return float(value.item() if isinstance(value, Tensor) else value)


def patch_positions(
    model: nn.Module,
    clean: Any,
    corrupted: Any,
    metric: Metric,
    *,
    hook: str = "resid_pre",
    stack: str | None = None,
) -> Tensor:
    """Sweep over blocks × positions: the metric with one block's activation at one position
    patched from the clean run.

    Args:
        hook: ``resid_pre`` | ``resid_mid`` | ``resid_post`` | ``attn_out`` | ``mlp_out``
            (``(B, T, C)`` activations).
        stack: which stack of blocks (default: the one that produces the output).

    Returns:
        ``(L, T)`` metric values.
    """
    if hook not in _POSITION_HOOKS:
        raise ValueError(f"unknown position hook {hook!r}; choose from {list(_POSITION_HOOKS)}")
    check_same_shapes(clean, corrupted)
    s = stack_of(model, stack)
    names = [s.hook(layer, f"hook_{hook}") for layer in range(len(s))]
    with torch.no_grad():
        _, cache = run_with_cache(model, clean, names=names)
    T = cache[names[0]].shape[1]
    result = torch.empty(len(s), T)
    for layer, name in enumerate(names):
        for p in range(T):
            where = lambda _, p=p: (slice(None), p)  # noqa: E731
            result[layer, p] = _metric(metric, _patched_run(model, cache, corrupted, [name], where))
    return result


def patch_heads(
    model: nn.Module,
    clean: Any,
    corrupted: Any,
    metric: Metric,
    *,
    hook: str = "z",
    stack: str | None = None,
    cross: bool = False,
) -> Tensor:
    """Sweep over blocks × heads: the metric with one head's activation (every position)
    patched from the clean run.

    Args:
        hook: ``z`` | ``q`` | ``k`` | ``v`` (``(B, T, H, D)``) or ``pattern`` | ``attn_scores``
            (``(B, H, T, S)``).
        stack: which stack of blocks (default: the one that produces the output).
        cross: patch the blocks' cross-attention instead of their self-attention.

    Returns:
        ``(L, H)`` metric values.
    """
    if hook not in _HEAD_HOOKS:
        raise ValueError(f"unknown head hook {hook!r}; choose from {list(_HEAD_HOOKS)}")
    check_same_shapes(clean, corrupted)
    s = stack_of(model, stack)
    attn = "cross_attn" if cross else "attn"
    if cross and not s.cross:
        raise ValueError(f"the blocks of stack {s.name!r} have no cross-attention")
    axis = _HEAD_HOOKS[hook]
    names = [s.hook(layer, f"{attn}.hook_{hook}") for layer in range(len(s))]
    with torch.no_grad():
        _, cache = run_with_cache(model, clean, names=names)
    result = torch.empty(len(s), s.n_heads)
    for layer, name in enumerate(names):
        for h in range(s.n_heads):

            def index(_: str, h: int = h) -> tuple:
                return (slice(None), h) if axis == 1 else (Ellipsis, h, slice(None))

            out = _patched_run(model, cache, corrupted, [name], index)
            result[layer, h] = _metric(metric, out)
    return result
