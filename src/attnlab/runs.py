"""Run directories: saving models with their config, and ``attnlab.load(run_dir)``.

A run directory holds::

    config.json          {"kind": <model kind>, "model": <model config>, "train": ..., "task": ...}
    model.safetensors    the weights (last checkpoint)
    best.safetensors     the weights with the best validation loss (when validation ran)
    tokenizer.json       (or another tokenizer file the model kind knows how to read)
    state.pt             optimizer / scheduler / RNG / step, for --resume
    metrics.jsonl        one JSON object per logged step
    loss.png             the loss curve

Every model family registers its *kind* here with :func:`register_kind`: the class to build from
the config dict, and how to read its tokenizer back. ``load`` then works for every family.
Writes are atomic: a temporary file in the same directory, then ``os.replace``.
"""

from __future__ import annotations

import importlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.errors import RunDirError

__all__ = [
    "register_kind",
    "load",
    "load_model",
    "save_model",
    "read_config",
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_save",
    "ModelKind",
]

# Modules that register kinds when imported; load() imports them on demand.
_KIND_MODULES = [
    "attnlab.models.lm",
    "attnlab.models.rnn_lm",
    "attnlab.models.rnn",
    "attnlab.models.seq2seq",
    "attnlab.models.vit",
    "attnlab.models.swin",
    "attnlab.models.cnn",
    "attnlab.models.caption",
    "attnlab.models.vqa",
]


@dataclass
class ModelKind:
    """How to rebuild one model family from a run directory.

    ``build(config_dict) -> nn.Module``; ``load_tokenizer(run_dir) -> tokenizer or None``.
    """

    name: str
    build: Callable[[dict], nn.Module]
    load_tokenizer: Callable[[Path], Any] | None = None


_KINDS: dict[str, ModelKind] = {}


def register_kind(
    name: str,
    build: Callable[[dict], nn.Module],
    load_tokenizer: Callable[[Path], Any] | None = None,
) -> None:
    """Register a model family under ``name`` (the ``kind`` in config.json)."""
    _KINDS[name] = ModelKind(name, build, load_tokenizer)


def _find_kind(name: str) -> ModelKind:
    if name not in _KINDS:
        for mod in _KIND_MODULES:
            try:
                importlib.import_module(mod)
            except ModuleNotFoundError as err:
                if err.name != mod:
                    raise
            if name in _KINDS:
                break
    if name not in _KINDS:
        raise RunDirError(
            f"unknown model kind {name!r} in config.json; known kinds: {sorted(_KINDS)}"
        )
    return _KINDS[name]


# ----------------------------------------------------------------------------------------------
# atomic writes

# mkstemp creates files readable by the owner only; give them the usual 0o666 & ~umask instead
_UMASK = os.umask(0)
os.umask(_UMASK)
_FILE_MODE = 0o666 & ~_UMASK


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file and a rename (never a half-written file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_save(path: str | os.PathLike, writer: Callable[[str], None]) -> None:
    """Call ``writer(tmp_path)`` then rename the result onto ``path`` (for torch.save, PNGs...)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix or ".tmp"
    )
    os.close(fd)
    try:
        writer(tmp)
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# ----------------------------------------------------------------------------------------------
# save / load


def read_config(run_dir: str | os.PathLike) -> dict:
    """Read and sanity-check ``config.json`` of a run directory."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise RunDirError(f"run directory {str(run_dir)!r} does not exist")
    if not run_dir.is_dir():
        raise RunDirError(f"{str(run_dir)!r} is not a directory")
    cfg_path = run_dir / "config.json"
    if not cfg_path.exists():
        raise RunDirError(f"{str(run_dir)!r} is not an attnlab run directory (no config.json)")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RunDirError(f"{cfg_path} is corrupted: {err}") from None
    if not isinstance(cfg, dict) or "kind" not in cfg or "model" not in cfg:
        raise RunDirError(f"{cfg_path} is not an attnlab config (needs 'kind' and 'model' keys)")
    return cfg


def save_model(model: nn.Module, path: str | os.PathLike) -> None:
    """Save weights as safetensors, atomically (tied weights are stored once)."""
    from safetensors.torch import save_model as st_save_model

    atomic_save(path, lambda tmp: st_save_model(model, tmp))


def load_model(
    run_dir: str | os.PathLike,
    *,
    weights: str = "model.safetensors",
    map_location: str | torch.device = "cpu",
) -> nn.Module:
    """Rebuild the model of a run directory from its config and weights (eval mode)."""
    from safetensors.torch import load_model as st_load_model

    run_dir = Path(run_dir)
    cfg = read_config(run_dir)
    kind = _find_kind(cfg["kind"])
    try:
        model = kind.build(cfg["model"])
    except (TypeError, KeyError) as err:
        raise RunDirError(
            f"{run_dir / 'config.json'}: model config does not fit kind {cfg['kind']!r}: {err}"
        ) from None
    wpath = run_dir / weights
    if not wpath.exists():
        raise RunDirError(f"{str(run_dir)!r} has no weights file {weights}")
    try:
        missing, unexpected = st_load_model(model, wpath, strict=False, device=str(map_location))
    except Exception as err:  # safetensors raises several types on a corrupted file
        raise RunDirError(f"cannot read weights {wpath}: {err}") from None
    if missing or unexpected:
        raise RunDirError(
            f"weights {wpath} do not match the model: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )
    return model.eval()


def load(
    run_dir: str | os.PathLike,
    *,
    weights: str = "model.safetensors",
    map_location: str | torch.device = "cpu",
) -> tuple[nn.Module, Any]:
    """``(model, tokenizer)`` from a run directory; the tokenizer is ``None`` for kinds without one."""
    model = load_model(run_dir, weights=weights, map_location=map_location)
    kind = _find_kind(read_config(run_dir)["kind"])
    tok = kind.load_tokenizer(Path(run_dir)) if kind.load_tokenizer else None
    return model, tok
