"""Building a config's model on the ``meta`` device within bounds from its weights' header.

See :mod:`attnlab.checkpoint_check` for the steps and the bounds.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from attnlab.checkpoint_check.explain import (
    DEPTH_FIELD,
    BuildStopped,
    Shapes,
    explain,
    flat_ints,
    set_path,
    top_layers,
)
from attnlab.errors import UserError

__all__ = [
    "Header",
    "MetaBuild",
    "read_header",
    "sharded_header",
    "build_on_meta",
    "model_shapes",
    "with_ties",
    "implied_size",
    "compare",
    "check_run_weights",
]

#: bytes per element of each safetensors dtype
_ITEMSIZE = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2}
_ITEMSIZE.update({"I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1})

#: ``config -> (model, expected, found)``: the model a config dict describes (built inside
#: ``torch.device("meta")``), the names and shapes it needs, and those the weights give it
ShapesOf = Callable[[Mapping[str, Any]], tuple[nn.Module, Shapes, Shapes]]


@dataclass(frozen=True)
class Header:
    """What the weights hold, from their headers: names, shapes and total size.

    Attributes:
        shapes: tensor name -> shape.
        nbytes: the bytes the tensors take (their dtypes' sizes).
        source: where they are, for messages (``model.safetensors``).
    """

    shapes: dict[str, tuple[int, ...]]
    nbytes: int
    source: str

    @property
    def numel(self) -> int:
        """Values in all the tensors."""
        return sum(math.prod(s) for s in self.shapes.values())

    @property
    def count(self) -> int:
        """How many tensors."""
        return len(self.shapes)


def read_header(
    files: Iterable[str | os.PathLike], *, error: type[UserError] = UserError
) -> Header:
    """Names, shapes and size of the tensors in safetensors ``files``, no tensor data read.

    Raises:
        error: a file that is missing or not safetensors (named).
    """
    shapes: dict[str, tuple[int, ...]] = {}
    nbytes = 0
    files = [Path(f) for f in files]
    for path in files:
        if not path.is_file():
            raise error(f"{path} does not exist: there are no weights to check the config against")
        try:
            with safe_open(str(path), "pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                    part = f.get_slice(name)
                    shapes[name] = tuple(part.get_shape())
                    nbytes += math.prod(shapes[name]) * _ITEMSIZE.get(part.get_dtype(), 4)
        except Exception as err:  # safetensors raises its own error type for a damaged file
            raise error(f"cannot read weights {path} (not safetensors): {err}") from None
    source = files[0].name if len(files) == 1 else f"{len(files)} safetensors files"
    return Header(shapes, nbytes, source)


def _message(what: str, why: str | None, detail: str) -> str:
    """``what: why (detail)``, or ``what: detail`` when no config field explains it."""
    return f"{what}: {why} ({detail})" if why else f"{what}: {detail}"


def _human(n: float) -> str:
    for unit in ("", "k", "M", "G", "T", "P"):
        if abs(n) < 1000:
            return f"{n:.3g}{unit}"
        n /= 1000
    return f"{n:.3g}E"


def sharded_header(
    folder: str | os.PathLike, *, prefix: str = "model.", error: type[UserError] = UserError
) -> Header:
    """The names and shapes of a sharded checkpoint's (``torch.distributed.checkpoint``)
    tensors under ``prefix``, from its ``.metadata`` (no tensor data).

    Raises:
        error: the metadata cannot be read.
    """
    # lazy: torch.distributed.checkpoint takes ~1.5 s to import; only sharded runs need it
    from torch.distributed.checkpoint import FileSystemReader

    folder = Path(folder)
    try:
        meta = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    except Exception as err:  # a damaged .metadata
        raise error(f"cannot read {folder / '.metadata'}: {err}") from None
    entries = {
        k.removeprefix(prefix): v
        for k, v in meta.items()
        if k.startswith(prefix) and hasattr(v, "size")
    }
    shapes = {n: tuple(v.size) for n, v in entries.items()}
    nbytes = sum(math.prod(v.size) * v.properties.dtype.itemsize for v in entries.values())
    return Header(shapes, nbytes, f"{folder.name} (sharded)")


# ---- building on meta, within bounds ------------------------------------------------------------


def _meta_build(build: Callable[[], Any], header: Header) -> Any:
    """``build()`` under ``torch.device("meta")``, stopped once it outgrows ``header``."""
    counts = {"tensors": 0, "modules": 0}
    limits = {"tensors": 4 * header.count + 64, "modules": 16 * header.count + 256}

    def count(key: str) -> Callable[..., None]:
        def hook(module: nn.Module, name: str, value: Any) -> None:
            if value is not None:
                counts[key] += 1
                if counts[key] > limits[key]:
                    raise BuildStopped(key, limits[key])

        return hook

    mod = torch.nn.modules.module
    handles = [
        mod.register_module_parameter_registration_hook(count("tensors")),
        mod.register_module_buffer_registration_hook(count("tensors")),
        mod.register_module_module_registration_hook(count("modules")),
    ]
    try:
        with torch.device("meta"):
            return build()
    finally:
        for h in handles:
            h.remove()


@dataclass(frozen=True)
class MetaBuild:
    """A config's model on the ``meta`` device, with what it needs and what the weights give.

    Attributes:
        model: the model, every tensor on ``meta``.
        expected: name -> shape the model needs.
        found: name -> shape the weights give (in the model's names).
        rebuild: ``config -> (expected, found)`` of another config, within the same bounds
            (what :func:`explain` tries its candidates with).
    """

    model: nn.Module
    expected: Shapes
    found: Shapes
    rebuild: Callable[[Mapping[str, Any]], tuple[Shapes, Shapes]]


def _too_deep(shapes_of: ShapesOf, config: Mapping[str, Any], header: Header) -> str | None:
    """What explains a config too big to build: its layer-count fields above the weights'
    layers, then what a build with those fields cut to the weights' count says of the rest."""
    have = top_layers(header.shapes)
    deep = {f: v for f, v in flat_ints(config).items() if DEPTH_FIELD.search(f) and v > have}
    claims = [
        f"config says {f}={v}; the weights have {have} layer{'s' * (have != 1)}"
        for f, v in deep.items()
    ]
    if claims and have:
        cut = dict(config)
        for field in deep:
            cut = set_path(cut, field, have)

        def rebuild(cfg: Mapping[str, Any]) -> tuple[Shapes, Shapes]:
            return _meta_build(lambda: shapes_of(cfg), header)[1:]

        try:
            why = explain(*rebuild(cut), cut, rebuild=rebuild)
            claims += [why] if why else []
        except (BuildStopped, Exception):  # the cut config only serves the message
            pass
    return " | ".join(claims) or None


def build_on_meta(
    shapes_of: ShapesOf,
    config: Mapping[str, Any],
    header: Header,
    *,
    what: str,
    error: type[UserError] = UserError,
) -> MetaBuild:
    """The model ``config`` describes, on the ``meta`` device, within bounds from ``header``.

    For a header of ``K`` tensors holding ``N`` values: a layer-count field (named like
    ``n_layers`` or ``depths``) above ``K`` is refused before anything is built; the build may
    create at most ``4 K + 64`` parameter and buffer tensors and ``16 K + 256`` modules (so
    even a config of a million layers costs milliseconds); the finished model may hold at most
    ``2 N + 2**24`` values (twice the header allows what a file may omit, such as an output
    head; ``2**24`` values, 64 MB in float32, allow buffers such as position tables).

    Args:
        shapes_of: ``config -> (model, expected, found)`` (see :data:`ShapesOf`).
        config: the config dict.
        header: the weights (:func:`read_header`).
        what: the message's subject (``cannot load 'runs/x'``).
        error: the exception class raised.

    Returns:
        The :class:`MetaBuild` of ``config``.

    Raises:
        error: the config asks for more layers, tensors, modules or values than its weights can
            fill (one line, with the config fields that explain it).
    """
    if any(DEPTH_FIELD.search(f) and v > header.count for f, v in flat_ints(config).items()):
        detail = f"{header.source} holds {header.count} tensors in all; nothing was built"
        raise error(_message(what, _too_deep(shapes_of, config, header), detail))
    try:
        model, expected, found = _meta_build(lambda: shapes_of(config), header)
    except BuildStopped as over:
        key, limit = over.args
        detail = (
            f"the config describes a model of more than {limit} {key}, but "
            f"{header.source} holds {header.count} tensors; nothing was built"
        )
        raise error(_message(what, _too_deep(shapes_of, config, header), detail)) from None

    def rebuild(cfg: Mapping[str, Any]) -> tuple[Shapes, Shapes]:
        return _meta_build(lambda: shapes_of(cfg), header)[1:]

    size = implied_size(model)
    if size > 2 * header.numel + 2**24:
        detail = (
            f"the config describes a model of {_human(size)} values ({_human(4 * size)}B in "
            f"float32), but {header.source} holds {_human(header.numel)} "
            f"({_human(header.nbytes)}B); nothing was built"
        )
        why = explain(expected, found, config, rebuild=rebuild) or _largest(model, config, header)
        raise error(_message(what, why, detail))
    return MetaBuild(model, expected, found, rebuild)


def _largest(model: nn.Module, config: Mapping[str, Any], header: Header) -> str | None:
    """``config says F=V; the weights have no dimension above D`` for a field whose value is a
    dimension of the model's largest tensor and above every dimension in the header (a buffer
    the weights do not hold, such as a sinusoidal table of ``max_seq_len`` rows)."""
    tensors = [*model.named_parameters(), *model.named_buffers()]
    if not tensors:
        return None
    name, big = max(tensors, key=lambda nt: nt[1].numel())
    top = max((d for s in header.shapes.values() for d in s), default=0)
    for field, v in flat_ints(config).items():
        if v > top and v in big.shape:
            return (
                f"config says {field}={v}; the weights have no dimension above {top} (it sets "
                f"{name} to {tuple(big.shape)})"
            )
    return None


def implied_size(model: nn.Module) -> int:
    """Values in a model's parameters and buffers, tied ones once (works on ``meta`` models)."""
    unique = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return sum(t.numel() for t in unique.values())


def model_shapes(model: nn.Module) -> tuple[Shapes, list[list[str]]]:
    """A model's state-dict names and shapes, and its groups of tied names (works on ``meta``).

    Returns:
        ``(shapes, tied)``: name -> shape, and lists of names sharing one tensor (a file stores
        such a tensor once, under any one of its names).
    """
    state = model.state_dict(keep_vars=True)
    groups: dict[int, list[str]] = {}
    for name, t in state.items():
        groups.setdefault(id(t), []).append(name)
    return (
        {n: tuple(t.shape) for n, t in state.items()},
        [names for names in groups.values() if len(names) > 1],
    )


def with_ties(found: Mapping[str, Sequence[int]], tied: Iterable[Sequence[str]]) -> Shapes:
    """``found`` with every name of a tied group filled in from the one the file holds."""
    out = {n: tuple(s) for n, s in found.items()}
    for names in tied:
        present = [n for n in names if n in out]
        for n in names:
            if present:
                out.setdefault(n, out[present[0]])
    return out


def compare(
    expected: Mapping[str, Sequence[int]],
    found: Mapping[str, Sequence[int]],
    config: Mapping[str, Any],
    *,
    what: str,
    source: str,
    error: type[UserError] = UserError,
    rebuild: Callable[[Mapping[str, Any]], tuple[Shapes, Shapes]] | None = None,
) -> None:
    """Refuse weights whose names or shapes differ from the ones the config implies.

    Args:
        expected: name -> shape the config's model has.
        found: name -> shape the weights hold (tied copies filled in: :func:`with_ties`).
        config: the config dict (for :func:`explain`).
        what: the message's subject (``cannot load 'runs/x'``).
        source: the weights' file name.
        error: the exception class raised.
        rebuild: passed to :func:`explain`.

    Raises:
        error: one line: the explaining config fields, then the first mismatched, missing and
            unexpected tensors.
    """
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    wrong = sorted(n for n in set(expected) & set(found) if tuple(expected[n]) != tuple(found[n]))
    if not (missing or unexpected or wrong):
        return
    problems = [
        f"{n} has shape {tuple(found[n])} in {source}, {tuple(expected[n])} from the config"
        for n in wrong[:3]
    ]
    if len(wrong) > 3:
        problems.append(f"{len(wrong) - 3} more of other shapes")
    if missing:
        problems.append(f"missing {missing[:5]}" + (" ..." if len(missing) > 5 else ""))
    if unexpected:
        problems.append(f"unexpected {unexpected[:5]}" + (" ..." if len(unexpected) > 5 else ""))
    why = explain(expected, found, config, rebuild=rebuild)
    detail = f"the weights do not fit the config: {'; '.join(problems)}; nothing was built"
    raise error(_message(what, why, detail))


def check_run_weights(
    kind: Any,
    model_config: Mapping[str, Any],
    header: Header,
    *,
    what: str,
    error: type[UserError] = UserError,
) -> None:
    """Check an attnlab run's model config against its weights' header, building on ``meta``.

    Args:
        kind: the run's :class:`~attnlab.models.registry.ModelKind` (its ``name``,
            ``config_cls``, ``build`` and ``upgrade`` are used).
        model_config: config.json's ``model`` section.
        header: the weights (:func:`read_header`).
        what: the message's subject.
        error: the exception class raised.

    Raises:
        error: a config that does not fit the kind, that outgrows its weights, or whose tensors
            differ from theirs (one line, naming the config field that explains it).
    """

    def shapes_of(cfg: Mapping[str, Any]) -> tuple[nn.Module, Shapes, Shapes]:
        try:
            model = kind.build(kind.config_cls.from_dict(dict(cfg)))
        except (TypeError, KeyError, ValueError) as err:
            raise error(
                f"{what}: the model config does not fit kind {kind.name!r}: {err}"
            ) from None
        expected, tied = model_shapes(model)
        found = dict(header.shapes)
        if kind.upgrade is not None:  # the names of earlier releases, on shape-only tensors
            meta = {n: torch.empty(s, device="meta") for n, s in found.items()}
            found = {n: tuple(t.shape) for n, t in kind.upgrade(meta).items()}
        return model, expected, with_ties(found, tied)

    built = build_on_meta(shapes_of, model_config, header, what=what, error=error)
    compare(
        built.expected,
        built.found,
        model_config,
        what=what,
        source=header.source,
        error=error,
        rebuild=built.rebuild,
    )
