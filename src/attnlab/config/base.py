"""The one config system: every model, task and training config is a dataclass built on ``Config``.

A config is plain data (JSON in a run directory, TOML/YAML on the command line), so it chooses
components by name (``norm: Literal["layernorm", "rmsnorm"]``) and never holds a class or a module.
The base class gives every config the same behaviour:

- types are checked from the annotations when it is built: ``int``, ``float``, ``bool``, ``str``,
  ``Literal[...]`` (the choices), ``X | None``, ``list``/``tuple``/``dict`` and nested configs; a
  wrong value raises :class:`ConfigError` naming the field, what it must be and what it got;
- ``validate()`` (overridden per config) derives defaults and checks values that must fit together;
  it never builds or runs a model;
- ``to_dict()`` / ``from_dict()`` round-trip through JSON; an unknown key raises
  :class:`ConfigError` naming it and the valid keys; keys renamed since an earlier release are
  mapped through ``RENAMED``;
- presets are data: ``PRESETS = {name: {field: value}}`` and ``preset(name, **overrides)``.

    @dataclass
    class ViTConfig(BlockConfig):
        PRESETS: ClassVar[dict] = {"tiny": dict(image_size=8, patch_size=2, d_model=64)}
        image_size: int = 224
        ...
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

from attnlab.errors import UserError, did_you_mean

__all__ = ["Config", "ConfigError"]

C = TypeVar("C", bound="Config")


class ConfigError(UserError):
    """A config value of the wrong type, out of range, or an unknown key or preset."""


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _describe(tp: Any) -> str:
    origin = get_origin(tp)
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        parts = [_describe(a) for a in get_args(tp) if a is not type(None)]
        return " or ".join(parts) + (" or null" if type(None) in get_args(tp) else "")
    if origin in (list, tuple) or tp in (list, tuple):
        return "a list"
    if origin is dict or tp is dict:
        return "a mapping"
    if isinstance(tp, type) and issubclass(tp, Config):
        return f"a mapping of {tp.__name__} fields"
    return str(tp)


def _literal_choices(tp: Any) -> list | None:
    """The allowed values of a ``Literal[...]`` annotation (``None`` included when optional)."""
    if get_origin(tp) is Literal:
        return list(get_args(tp))
    if get_origin(tp) in (Union, types.UnionType):
        lits = [a for arg in get_args(tp) if get_origin(arg) is Literal for a in get_args(arg)]
        if lits:
            return ([None] if type(None) in get_args(tp) else []) + lits
    return None


class _Mismatch(Exception):
    pass


def _coerce(value: Any, tp: Any) -> Any:
    """``value`` as type ``tp`` (lists for tuples, dicts for nested configs) or raise _Mismatch."""
    if tp is Any:
        return value
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise _Mismatch
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg)
            except _Mismatch:
                continue
        raise _Mismatch
    if origin is Literal:
        if any(value == a and type(value) is type(a) for a in get_args(tp)):
            return value
        raise _Mismatch
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Mismatch
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _Mismatch
    if tp is str:
        if isinstance(value, str):
            return value
        raise _Mismatch
    if origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        args = get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                raise _Mismatch
            return tuple(_coerce(v, a) for v, a in zip(value, args))
        elem = args[0] if args else Any
        items = [_coerce(v, elem) for v in value]
        return tuple(items) if (origin is tuple or tp is tuple) else items
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise _Mismatch
        return dict(value)
    if isinstance(tp, type) and issubclass(tp, Config):
        if isinstance(value, tp):
            return value
        if isinstance(value, Mapping):
            return tp.from_dict(value)
        raise _Mismatch
    return value


class Config:
    """Base of every attnlab config dataclass (see the module docstring).

    Subclasses are ``@dataclass`` classes; they override :meth:`validate`, calling
    ``super().validate()`` first, to derive and check values.
    """

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {}
    #: keys of earlier releases' config.json -> today's field names
    RENAMED: ClassVar[dict[str, str]] = {}
    #: keys accepted by ``from_dict`` and dropped: derived values recorded for people to read
    #: (token counts, dataset sizes) that a run's config.json holds next to the settings
    IGNORED: ClassVar[frozenset[str]] = frozenset()

    def __post_init__(self) -> None:
        self.check_types()
        self.validate()

    # -- checks ---------------------------------------------------------------------------------

    def check_types(self) -> None:
        """Check (and normalise: int -> float, list -> tuple) every field against its annotation.

        Raises:
            ConfigError: naming the field, what it must be and the value it got.
        """
        hints = _hints(type(self))
        for f in dataclasses.fields(self):
            if not f.init:
                continue
            tp, value = hints[f.name], getattr(self, f.name)
            try:
                setattr(self, f.name, _coerce(value, tp))
            except _Mismatch:
                choices = _literal_choices(tp)
                if choices:
                    hint = did_you_mean(value, map(str, choices)) if isinstance(value, str) else ""
                    raise ConfigError(
                        f"unknown {f.name} {value!r}{hint}; choose from {choices}"
                    ) from None
                raise ConfigError(f"{f.name} must be {_describe(tp)}, got {value!r}") from None

    def validate(self) -> None:
        """Derive defaults and check values that must fit together (override; call super)."""

    def positive(self, *names: str, allow_zero: bool = False) -> None:
        """Raise :class:`ConfigError` for the first field of ``names`` that is not > 0 (>= 0)."""
        for name in names:
            v = getattr(self, name)
            if v is None:
                continue
            if v < 0 or (v == 0 and not allow_zero):
                want = "must be >= 0" if allow_zero else "must be positive"
                raise ConfigError(f"{name} {want}, got {v!r}")

    def fraction(self, *names: str) -> None:
        """Raise :class:`ConfigError` for the first field of ``names`` outside [0, 1)."""
        for name in names:
            v = getattr(self, name)
            if not 0.0 <= v < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {v!r}")

    # -- serialisation --------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of every field (derived values filled in)."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self) if f.init}

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.init]

    @classmethod
    def from_dict(cls: type[C], d: Mapping[str, Any]) -> C:
        """Inverse of :meth:`to_dict`.

        Raises:
            ConfigError: ``d`` is not a mapping, has an unknown key (named, with the valid ones),
                or a value that does not fit.
        """
        if not isinstance(d, Mapping):
            raise ConfigError(f"{cls.__name__} needs a mapping of fields, got {type(d).__name__}")
        d = {cls.RENAMED.get(k, k): v for k, v in d.items() if k not in cls.IGNORED}
        names = cls.field_names()
        unknown = sorted(set(d) - set(names))
        if unknown:
            hints = [did_you_mean(k, names) for k in unknown]
            hint = f" {' '.join(h.strip() for h in hints if h)}" if any(hints) else ""
            raise ConfigError(
                f"unknown {cls.__name__} field(s) {unknown}{hint}; valid fields: {', '.join(names)}"
            )
        return cls(**d)

    @classmethod
    def presets(cls) -> list[str]:
        """Names of the presets of this config class."""
        return sorted(cls.PRESETS)

    @classmethod
    def preset(cls: type[C], name: str, **overrides: Any) -> C:
        """A named preset with fields overridden.

        Raises:
            ConfigError: unknown preset (the message lists the known ones) or field.
        """
        if name not in cls.PRESETS:
            raise ConfigError(
                f"unknown {cls.__name__} preset {name!r}{did_you_mean(name, cls.presets())}; "
                f"choose from {cls.presets()}"
            )
        return cls.from_dict({**cls.PRESETS[name], **overrides})

    def replace(self: C, **changes: Any) -> C:
        """A copy with ``changes`` applied and validated again."""
        return type(self).from_dict({**self.to_dict(), **changes})


def _plain(v: Any) -> Any:
    if isinstance(v, Config):
        return v.to_dict()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v
