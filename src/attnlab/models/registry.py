"""Model kinds: the ``kind`` in a run's config.json -> its config class and model class.

Every model family registers itself here when its module is imported::

    register_kind("decoder_lm", ModelConfig, DecoderLM, artifacts="tokenizer")

and :func:`build_model` / :func:`attnlab.load` then work for every family (every module of
:mod:`attnlab.models` is imported on the first look-up of an unknown kind). ``artifacts`` says what
the run directory holds besides weights (how :mod:`attnlab.runs` reads it back); ``upgrade`` maps
the weight names of earlier releases to today's.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from torch import Tensor, nn

from attnlab.errors import UserError

__all__ = ["ModelKind", "register_kind", "get_kind", "build_model", "known_kinds", "kind_of"]

Artifacts = Literal["tokenizer", "translation_vocab", "scene_vocab", "labels", "none"]


@dataclass(frozen=True)
class ModelKind:
    """How to rebuild one model family.

    Attributes:
        name: the ``kind`` stored in config.json.
        config_cls: its config class (``from_dict`` reads config.json's ``model``).
        build: ``config -> nn.Module`` (usually the model class itself).
        artifacts: what else the run directory holds: ``tokenizer`` (tokenizer.json),
            ``translation_vocab`` / ``scene_vocab`` (vocab.json), ``labels`` (labels.json) or
            ``none``.
        upgrade: renames the weights of earlier releases to today's names (or None).
    """

    name: str
    config_cls: type
    build: Callable[[Any], nn.Module]
    artifacts: Artifacts = "none"
    upgrade: Callable[[dict[str, Tensor]], dict[str, Tensor]] | None = None


_KINDS: dict[str, ModelKind] = {}


def register_kind(
    name: str,
    config_cls: type,
    build: Callable[[Any], nn.Module],
    *,
    artifacts: Artifacts = "none",
    upgrade: Callable[[dict[str, Tensor]], dict[str, Tensor]] | None = None,
) -> None:
    """Register a model family under ``name`` (the ``kind`` in config.json)."""
    _KINDS[name] = ModelKind(name, config_cls, build, artifacts, upgrade)


def _import_all() -> None:
    """Import every module of :mod:`attnlab.models` (each registers its kinds)."""
    package_dir = str(Path(__file__).parent)  # this module's package: attnlab.models
    for info in pkgutil.walk_packages([package_dir], prefix="attnlab.models."):
        importlib.import_module(info.name)


def get_kind(name: str) -> ModelKind:
    """The registered :class:`ModelKind` called ``name``.

    Raises:
        UserError: no such kind (the message lists the known ones).
    """
    if name not in _KINDS:
        _import_all()
    if name not in _KINDS:
        raise UserError(f"unknown model kind {name!r}; known kinds: {known_kinds()}")
    return _KINDS[name]


def known_kinds() -> list[str]:
    _import_all()
    return sorted(_KINDS)


def build_model(kind: str, config: Any) -> nn.Module:
    """Build a model of ``kind`` from its config object or config dict.

    Raises:
        UserError: unknown kind, or a config that does not fit it.
    """
    k = get_kind(kind)
    if not isinstance(config, k.config_cls):
        config = k.config_cls.from_dict(config)
    return k.build(config)


def kind_of(model: nn.Module) -> str:
    """The registered kind of a model (its ``kind`` attribute)."""
    kind = getattr(model, "kind", None)
    if not isinstance(kind, str):
        raise UserError(f"{type(model).__name__} is not a registered attnlab model (no kind)")
    return kind
