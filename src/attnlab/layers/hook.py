"""What inspection reads from a forward pass: hook points, and captures of what layers report.

**Hook points.** Named identity modules at every activation a researcher may read or edit.

A :class:`HookPoint` is an ``nn.Identity``: with nothing registered on it a forward passes the
tensor through untouched (one module call), so models keep them in every forward. A forward hook
registered on it reads the activation, or returns a replacement that flows on
(``attnlab.inspect.run_with_cache`` / ``run_with_hooks`` do the registering). Layers that can
compute an activation two ways (fused attention kernels, fused LayerNorm) ask
:func:`hooks_active` and take the explicit path only while a hook point that needs it is in use.

Names follow TransformerLens where the concept is the same: :func:`hook_points` turns module
paths into hook names (``blocks.0.norm1.hook_scale`` -> ``blocks.0.ln1.hook_scale``,
``blocks.0.ffn.hook_pre`` -> ``blocks.0.mlp.hook_pre``, ``norm_f`` -> ``ln_final``,
``pos_emb.hook_pos_embed`` -> ``hook_pos_embed``).

**Captures.** What a forward computes on the side (attention weights, auxiliary losses), read
without storing it on modules.

The caller opens a context; attention layers (and MoE layers) report into it while it is open;
the caller reads the result. Modules keep no per-call state, so forward stays re-entrant and
``torch.compile`` sees one graph (outside a capture, a layer only checks one module-level list).

    with capture_attention(model) as maps:        # every attention layer of the model
        logits = model(idx)
    maps["blocks.0.attn"]                          # (B, H, T, S) weights of that layer's last call
    maps.calls("blocks.0.attn")                    # one tensor per call (incremental decoding)

    with capture_attention(model, scores=True) as maps:   # also the raw scores (opt-in)
        logits = model(idx)
    maps.scores("blocks.0.attn")                   # (B, H, T, S) logits of the softmax, -inf masked

    with collect_aux_losses() as aux:              # MoE load-balancing losses of this forward
        logits = model(idx)
    loss = ce + coef * aux.total()

Models that return weights from their own ``forward(..., need_weights=True)`` use the same
context inside, so both ways give the same numbers.

(:mod:`attnlab.attention.capture` re-exports the captures under their first-release path.)
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping

import torch
from torch import Tensor, nn
from torch.nn.modules import module as _module

#: the captures' names (:mod:`attnlab.attention.capture` re-exports them)
CAPTURES = (
    "AttentionMaps",
    "AuxLosses",
    "capture_attention",
    "collect_aux_losses",
    "capturing_attention",
    "capturing_scores",
    "report_attention",
    "report_aux_loss",
)

__all__ = ["HookPoint", "hook_points", "hook_name", "hooks_active", "CAPTURES", *CAPTURES]


class HookPoint(nn.Identity):
    """An identity module with a name: the place a hook reads or replaces one activation.

    ``name`` is set by :func:`hook_points` (the module's TransformerLens-style path in the model).
    """

    def __init__(self) -> None:
        super().__init__()
        self.name: str | None = None

    def __call__(self, x: Tensor) -> Tensor:
        # idle (the usual case): hand the tensor back without nn.Module's call machinery, a
        # quarter of its cost; torch.compile traces this as the identity (fullgraph), and, as
        # for any module, does not see hooks registered after it compiled
        if self.active:
            return super().__call__(x)
        return x

    @property
    def active(self) -> bool:
        """True while a hook is registered on this point (or a global module hook is)."""
        return bool(
            self._forward_hooks
            or self._forward_pre_hooks
            or _module._global_forward_hooks
            or _module._global_forward_pre_hooks
        )

    def extra_repr(self) -> str:
        return "" if self.name is None else f"name={self.name!r}"


def hooks_active(*points: nn.Module | None) -> bool:
    """True when any of ``points`` is a :class:`HookPoint` with a hook on it."""
    return any(isinstance(p, HookPoint) and p.active for p in points)


# module path -> TransformerLens's names for the same thing
_ALIASES = [
    (re.compile(r"(^|\.)norm1\."), r"\1ln1."),
    (re.compile(r"(^|\.)norm2\."), r"\1ln2."),
    (re.compile(r"(^|\.)norm_cross\."), r"\1ln_cross."),
    (re.compile(r"(^|\.)ffn\."), r"\1mlp."),
    (re.compile(r"^norm_f\."), "ln_final."),
    (re.compile(r"(^|\.)pos_emb(ed)?\.hook_pos_embed\.$"), r"\1hook_pos_embed."),
]


def hook_name(module_path: str) -> str:
    """The hook name of the hook point at ``module_path`` (``blocks.0.norm1.hook_scale`` ->
    ``blocks.0.ln1.hook_scale``)."""
    name = module_path + "."  # a module's own path is renamed like a prefix
    for pattern, repl in _ALIASES:
        name = pattern.sub(repl, name)
    return name[:-1]


def hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """Every hook point of ``model`` by hook name, in module order; sets each point's ``name``.

    A hook point reachable by two paths (a shared module) is listed once, under its first path.
    """
    points: dict[str, HookPoint] = {}
    for path, module in model.named_modules():
        if isinstance(module, HookPoint):
            name = hook_name(path)
            module.name = name
            points[name] = module
    return points


# ----------------------------------------------------------------------------------------------
# captures: what layers report while a context is open


_ATTENTION: list[AttentionMaps] = []  # open captures, innermost last
_AUX: list[AuxLosses] = []


class AttentionMaps(Mapping):
    """Attention weights by layer name, in the order the layers ran.

    ``maps[name]`` is the weights of that layer's last call, ``(B, H, Tq, Tk)`` for multi-head
    attention (``(B, S)`` for additive attention); ``maps.calls(name)`` lists every call.
    Names are the layers' names in the model given to :func:`capture_attention`
    (``blocks.0.attn``, ``decoder.1.cross_attn`` ...).

    With ``scores=True`` the layers also report their raw scores, the logits the softmax turns
    into the weights (``Q Kᵀ/√d`` plus any position bias, ``-inf`` where masked):
    ``maps.scores(name)``, ``maps.score_calls(name)``.
    """

    def __init__(self, model: nn.Module | None = None, *, scores: bool = False) -> None:
        self._names: dict[int, str] = {}
        if model is not None:
            for name, module in model.named_modules():
                self._names.setdefault(id(module), name)
        self._calls: dict[str, list[Tensor]] = {}
        self.wants_scores = scores
        self._scores: dict[str, list[Tensor]] = {}

    def _name(self, module: nn.Module) -> str:
        name = self._names.get(id(module))
        if name is None:  # a layer outside the given model: number it by first appearance
            name = f"{type(module).__name__}.{len(self._names)}"
            self._names[id(module)] = name
        return name

    def add(self, module: nn.Module, weights: Tensor, scores: Tensor | None = None) -> None:
        name = self._name(module)
        self._calls.setdefault(name, []).append(weights.detach())
        if self.wants_scores and scores is not None:
            self._scores.setdefault(name, []).append(scores.detach())

    def __getitem__(self, name: str) -> Tensor:
        if name not in self._calls:
            raise KeyError(f"no attention recorded for {name!r}; recorded: {list(self._calls)}")
        return self._calls[name][-1]

    def __iter__(self) -> Iterator[str]:
        return iter(self._calls)

    def __len__(self) -> int:
        return len(self._calls)

    def calls(self, name: str) -> list[Tensor]:
        """Every recorded call of layer ``name``, oldest first."""
        return list(self._calls.get(name, []))

    def scores(self, name: str) -> Tensor | None:
        """Raw scores of layer ``name``'s last call (None when the layer reported none)."""
        calls = self._scores.get(name)
        return calls[-1] if calls else None

    def score_calls(self, name: str) -> list[Tensor]:
        """Raw scores of every recorded call of layer ``name``, oldest first."""
        return list(self._scores.get(name, []))

    def select(self, suffix: str) -> list[Tensor]:
        """Last weights of the layers whose name ends with ``suffix`` (``.attn``, ``.cross_attn``),
        in the order they ran: one tensor per layer."""
        return [self[n] for n in self._calls if n == suffix or n.endswith("." + suffix)]


class AuxLosses:
    """Auxiliary losses (MoE load balancing) and expert counts reported during a forward."""

    def __init__(self) -> None:
        self.losses: list[Tensor] = []
        self.expert_counts: list[Tensor] = []

    def total(self) -> Tensor:
        """The sum of the reported losses (a zero scalar when none were)."""
        if not self.losses:
            return torch.zeros(())
        return torch.stack([loss.float() for loss in self.losses]).sum()


@contextlib.contextmanager
def capture_attention(
    model: nn.Module | None = None, *, scores: bool = False
) -> Iterator[AttentionMaps]:
    """Collect the attention weights of every attention layer that runs inside the block.

    Args:
        model: names the layers (``model.named_modules()``); layers outside it are numbered.
        scores: also collect each layer's raw scores (the softmax's input; costs one more
            ``Q Kᵀ`` per layer, so only when asked).

    Attention layers compute explicit weights (the math path) while a capture is open.
    """
    maps = AttentionMaps(model, scores=scores)
    _ATTENTION.append(maps)
    try:
        yield maps
    finally:
        _ATTENTION.remove(maps)


@contextlib.contextmanager
def collect_aux_losses() -> Iterator[AuxLosses]:
    """Collect the auxiliary losses that layers report inside the block."""
    aux = AuxLosses()
    _AUX.append(aux)
    try:
        yield aux
    finally:
        _AUX.remove(aux)


def capturing_attention() -> bool:
    """True while a :func:`capture_attention` context is open."""
    return bool(_ATTENTION)


def capturing_scores() -> bool:
    """True while an open capture asked for the raw scores (``capture_attention(scores=True)``)."""
    return any(maps.wants_scores for maps in _ATTENTION)


def report_attention(module: nn.Module, weights: Tensor, scores: Tensor | None = None) -> None:
    """Called by attention layers with the weights of this call (no-op outside a capture), and,
    when :func:`capturing_scores`, the raw scores they were computed from."""
    for maps in _ATTENTION:
        maps.add(module, weights, scores)


def report_aux_loss(loss: Tensor, expert_counts: Tensor | None = None) -> None:
    """Called by MoE layers with this call's load-balancing loss (no-op outside a collection)."""
    for aux in _AUX:
        aux.losses.append(loss)
        if expert_counts is not None:
            aux.expert_counts.append(expert_counts)
