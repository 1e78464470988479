"""Hook points: named identity modules at every activation a researcher may read or edit.

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
"""

from __future__ import annotations

import re

from torch import Tensor, nn
from torch.nn.modules import module as _module

__all__ = ["HookPoint", "hook_points", "hook_name", "hooks_active"]


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
