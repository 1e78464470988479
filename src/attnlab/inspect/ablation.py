"""Ablation: switch off attention heads, MLP neurons or MoE experts and see what changes.

    with ablate_heads(model, {"blocks.0.attn": [1]}):           # zero ablation
        logits = model(idx)
    with ablate_heads(model, {"blocks.0.attn": [1]}, mode="mean", reference=idx):
        logits = model(idx)

- a head is ablated at ``attn.hook_z`` (its weighted values, before W_O): zero ablation is the
  same as zeroing the head's columns of W_O; mean ablation puts the head's mean z over the
  reference batch and positions in its place;
- a neuron at ``mlp.hook_post`` (after the non-linearity), the same two ways;
- an expert of a MoE layer: zero ablation drops its weighted output from every token routed to
  it (the other experts' weights are not renormalised); mean ablation gives each such token the
  expert's mean output over the reference batch instead.

Shape legend: B batch, T time, H heads, D head dim, I MLP width, E experts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn

from attnlab.inspect.hooks import HookFn, hooks, run_model, run_with_cache, unknown_name
from attnlab.layers.hook import hook_name, hook_points
from attnlab.layers.moe import MoE

__all__ = ["AblationMode", "ablate_experts", "ablate_heads", "ablate_neurons", "ablation_hooks"]

AblationMode = Literal["zero", "mean"]
Spec = Mapping[str, Sequence[int]]


def _point(model: nn.Module, prefix: str, suffix: str) -> str:
    name = prefix if prefix.endswith("." + suffix) else f"{prefix}.{suffix}"
    points = hook_points(model)
    if name not in points:
        raise unknown_name(name, list(points))
    return name


def _check_mode(mode: str) -> None:
    if mode not in ("zero", "mean"):
        raise ValueError(f"unknown ablation mode {mode!r}; choose 'zero' or 'mean'")


def ablation_hooks(
    model: nn.Module,
    spec: Spec,
    *,
    suffix: str,
    axis: int,
    mode: AblationMode = "zero",
    reference: Any = None,
) -> list[tuple[str, HookFn]]:
    """Hooks that ablate units ``spec[prefix]`` along ``axis`` of ``{prefix}.{suffix}``.

    Args:
        spec: ``{prefix: [unit, ...]}`` (``{"blocks.0.attn": [0, 3]}``).
        suffix: the hook point (``hook_z`` for heads, ``hook_post`` for neurons).
        axis: the units' axis of that activation (heads: -2 of ``(B, T, H, D)``).
        mode: ``zero`` or ``mean`` (the mean over every other axis but the last, on
            ``reference``).
        reference: inputs of the run that gives the means (mean mode; default: none, an error).

    Returns:
        ``[(hook name, fn)]`` for :func:`attnlab.inspect.run_with_hooks` or
        :func:`attnlab.inspect.hooks`.
    """
    _check_mode(mode)
    names = {_point(model, prefix, suffix): list(units) for prefix, units in spec.items()}
    means: dict[str, Tensor] = {}
    if mode == "mean":
        if reference is None:
            raise ValueError("mean ablation needs reference inputs (reference=...)")
        with torch.no_grad():
            _, cache = run_with_cache(model, reference, names=list(names))
        for name in names:
            act = torch.cat([c.flatten(0, c.dim() + axis - 1) for c in cache.calls(name)], 0)
            means[name] = act.mean(dim=0)  # the unit axis and what follows: (H, D) or (I,)

    def make(name: str, units: list[int]) -> HookFn:
        def fn(act: Tensor, _: str) -> Tensor:
            n_units = act.shape[axis]
            bad = [u for u in units if not -n_units <= u < n_units]
            if bad:
                raise ValueError(f"{name} has {n_units} units along axis {axis}; got {bad}")
            out = act.clone()
            index = [slice(None)] * act.dim()
            index[axis] = units
            out[tuple(index)] = 0.0 if mode == "zero" else means[name][units].to(act.dtype)
            return out

        return fn

    return [(name, make(name, units)) for name, units in names.items()]


@contextlib.contextmanager
def ablate_heads(
    model: nn.Module, heads: Spec, *, mode: AblationMode = "zero", reference: Any = None
) -> Iterator[None]:
    """Ablate attention heads for the ``with`` block.

    Args:
        heads: ``{attention module path: [head, ...]}`` (``{"blocks.0.attn": [1]}``,
            ``{"decoder.1.cross_attn": [0]}``).
        mode: ``zero`` (the head's output is 0) or ``mean`` (its mean z on ``reference``).
        reference: inputs for the means (mean mode).
    """
    spec = ablation_hooks(model, heads, suffix="hook_z", axis=-2, mode=mode, reference=reference)
    with hooks(model, spec):
        yield


@contextlib.contextmanager
def ablate_neurons(
    model: nn.Module, neurons: Spec, *, mode: AblationMode = "zero", reference: Any = None
) -> Iterator[None]:
    """Ablate MLP neurons (after the non-linearity) for the ``with`` block.

    Args:
        neurons: ``{MLP path: [neuron, ...]}`` (``{"blocks.0.mlp": [7, 12]}``).
        mode, reference: as for :func:`ablate_heads`.
    """
    spec = ablation_hooks(
        model, neurons, suffix="hook_post", axis=-1, mode=mode, reference=reference
    )
    with hooks(model, spec):
        yield


def _moe(model: nn.Module, path: str) -> MoE:
    layers = {n: m for n, m in model.named_modules() if isinstance(m, MoE)}
    for name, module in layers.items():
        if path in (name, hook_name(name)):
            return module
    known = sorted(hook_name(n) for n in layers) or "none"
    raise ValueError(f"no MoE layer at {path!r}; MoE layers: {known}")


@contextlib.contextmanager
def ablate_experts(
    model: nn.Module, experts: Spec, *, mode: AblationMode = "zero", reference: Any = None
) -> Iterator[None]:
    """Ablate MoE experts for the ``with`` block.

    Args:
        experts: ``{MoE path: [expert, ...]}`` (``{"blocks.1.mlp": [3]}``; the module path
            ``blocks.1.ffn`` works too).
        mode: ``zero`` (the expert adds nothing) or ``mean`` (each token routed to it gets its
            mean output on ``reference``, with the token's routing weight).
        reference: inputs for the means (mean mode).
    """
    _check_mode(mode)
    layers = {_moe(model, path): list(units) for path, units in experts.items()}
    for moe, units in layers.items():
        bad = [e for e in units if not 0 <= e < moe.n_experts]
        if bad:
            raise ValueError(f"a MoE layer has {moe.n_experts} experts; got {bad}")
    means: dict[tuple[int, int], Tensor] = {}
    if mode == "mean":
        if reference is None:
            raise ValueError("mean ablation needs reference inputs (reference=...)")
        sums: dict[tuple[int, int], list[Tensor]] = {}
        with _expert_outputs(layers, lambda key, y: sums.setdefault(key, []).append(y)):
            with torch.no_grad():
                run_model(model, reference)
        for moe, units in layers.items():
            for e in units:
                ys = sums.get((id(moe), e))
                means[(id(moe), e)] = (
                    torch.cat(ys).mean(0) if ys else moe.w_out.new_zeros(moe.d_model)
                )  # (C,): an expert no token chose adds nothing

    def replace(key: tuple[int, int], y: Tensor) -> Tensor:
        if mode == "zero":
            return torch.zeros_like(y)
        return means[key].to(y.dtype).expand_as(y)

    with _expert_outputs(layers, replace):
        yield


@contextlib.contextmanager
def _expert_outputs(layers: Mapping[MoE, Sequence[int]], fn) -> Iterator[None]:
    """Route the outputs of the chosen experts through ``fn((id(moe), e), y)`` (a replacement
    or None) by shadowing each layer's ``expert_forward`` for the block."""
    for moe, units in layers.items():
        original = moe.expert_forward
        chosen = set(units)

        def expert_forward(e: int, h: Tensor, _orig=original, _moe=moe, _chosen=chosen) -> Tensor:
            y = _orig(e, h)
            if e not in _chosen:
                return y
            new = fn((id(_moe), e), y)
            return y if new is None else new

        moe.expert_forward = expert_forward  # an instance attribute shadows the method
    try:
        yield
    finally:
        for moe in layers:
            del moe.expert_forward
