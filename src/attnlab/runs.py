"""Run directories, and ``attnlab.load(run)`` for every kind of run.

A run directory holds::

    config.json          {"kind": <model kind>, "model": <model config>, "train": ..., "task": ...}
    model.safetensors    the weights (last checkpoint)
    best.safetensors     the weights with the best validation loss (when validation ran)
    tokenizer.json       the tokenizer (LMs), vocab.json (translation, captioning, VQA) or
                         labels.json (image classifiers: class names, image shape, normalisation)
    state.pt             optimizer / scheduler / RNG / step, for --resume
    checkpoints/step-N/  instead of state.pt, in a run trained with ``--strategy fsdp``: the
                         sharded checkpoint of step N (torch.distributed.checkpoint: one file
                         per rank, ``.metadata``, ``state.pt`` without the optimizer,
                         ``checkpoint.json`` naming the model); the last one is kept
    metrics.jsonl        one JSON object per logged step
    loss.png             the loss curve

A sharded run ends with a consolidated ``model.safetensors``; when its newest checkpoint is a
sharded one (a run stopped before the end), ``load`` reads the weights from it, in one process
(``attnlab convert --consolidate RUN`` writes ``model.safetensors`` from it).

``load`` rebuilds the model from the kind's registered config and class
(:mod:`attnlab.models.registry`) and reads back what the kind needs to turn inputs into tensors
and outputs into words: one loader for every family, used by every command. Writes are atomic
(:mod:`attnlab.fileio`).
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import save_model as st_save_model
from torch import nn

from attnlab.checkpoint_check import check_run_weights, read_header, sharded_header
from attnlab.data.images import ImageSettings
from attnlab.data.scenes import Vocab
from attnlab.data.tokenizers import TOKENIZER_FILE, load_tokenizer
from attnlab.data.translation import load_vocabs

# atomic writes and the sharded-checkpoint helpers live in fileio and dcp_files; their names
# stay importable from here (earlier releases exported them), outside this module's __all__
from attnlab.dcp_files import (  # noqa: F401
    LAST_WEIGHTS,
    SHARDED_DIR,
    SHARDED_META,
    check_sharded_identity,
    first_failure,
    last_sharded,
    newest_weights,
    read_sharded_weights,
    sharded_checkpoints,
    sharded_mismatch,
    single_process_dcp,
    weights_step,
)
from attnlab.errors import RunDirError, UserError
from attnlab.fast.quant import quantize_int8
from attnlab.fileio import atomic_save, atomic_write_bytes, atomic_write_text  # noqa: F401
from attnlab.models.registry import ModelKind, get_kind
from attnlab.runspec import RunSpec, build_run, resolve

__all__ = [
    "RunSpec",
    "resolve",
    "build_run",
    "describe_weights",
    "LoadedRun",
    "load",
    "load_model",
    "check_config",
    "check_resumable",
    "save_model",
    "read_config",
    "WEIGHT_FILES",
    "QUANTIZE",
    "resolve_dtype",
]

#: ``weights=`` names accepted by :func:`load` besides a file name
WEIGHT_FILES = {"last": LAST_WEIGHTS, "best": "best.safetensors"}


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
    atomic_save(path, lambda tmp: st_save_model(model, tmp))


def _weights_path(run_dir: Path, weights: str) -> Path:
    """The weights file of ``weights`` (last, best or a file name), or a sharded checkpoint's
    folder when that holds the newest weights."""
    name = WEIGHT_FILES.get(weights, weights)
    path = run_dir / name
    if name == WEIGHT_FILES["best"] and not path.exists():
        name = WEIGHT_FILES["last"]  # no validation ran: the last weights are the best
    if name == WEIGHT_FILES["last"]:
        path = newest_weights(run_dir)
    if not path.exists():
        raise RunDirError(f"{str(run_dir)!r} has no weights file {name}")
    return path


def describe_weights(run_dir: str | os.PathLike, weights: str = "best") -> str:
    """One line saying which checkpoint ``weights`` reads: ``best checkpoint (best.safetensors,
    step 480, val loss 1.2345)``; the step and the validation numbers come from the file's
    metadata and ``metrics.jsonl`` where they were recorded.

    Raises:
        RunDirError: the run has no such weights.
    """
    run_dir = Path(run_dir)
    path = _weights_path(run_dir, weights)
    if path.is_dir():
        return f"last checkpoint (sharded, {path.name})"
    which = {v: k for k, v in WEIGHT_FILES.items()}.get(path.name, path.name)
    parts = [path.name]
    note = "; the run has no best.safetensors" if weights != which == "last" else ""
    try:
        step = weights_step(path)
    except Exception:  # (read again, with a clear error, when the weights are loaded)
        step = None
    if step is not None:
        parts.append(f"step {step}")
        metrics = run_dir / "metrics.jsonl"
        for line in metrics.read_text().splitlines() if metrics.exists() else []:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and rec.get("step") == step:
                vals = {k: v for k, v in rec.items() if k.startswith("val_") and _number(v)}
                if vals:
                    parts[2:] = [f"{k.replace('_', ' ')} {v:.4g}" for k, v in vals.items()]
    return f"{which} checkpoint ({', '.join(parts)}{note})"


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_resumable(run_dir: str | os.PathLike) -> None:
    """Before a ``--resume`` builds its model: config.json against the newest weights, as
    :func:`check_config` (a run of a kind attnlab does not register is left to the trainer).

    Raises:
        RunDirError: a config that outgrows its weights or differs from them.
    """
    run_dir = Path(run_dir)
    cfg = read_config(run_dir)
    wpath = newest_weights(run_dir)
    try:
        get_kind(cfg["kind"])
    except UserError:
        return
    if wpath.exists():
        check_config(run_dir, cfg, wpath, what=f"cannot resume {str(run_dir)!r}")


def check_config(run_dir: Path, cfg: dict, wpath: Path, *, what: str | None = None) -> None:
    """Check config.json's model against the header of its weights ``wpath`` (a safetensors
    file or a sharded checkpoint's folder) on the ``meta`` device, before anything real is
    built (:mod:`attnlab.checkpoint_check`).

    Raises:
        RunDirError: unreadable weights, or a config that outgrows them or differs from them
            (one line, naming the config field that explains it).
    """
    kind = _kind(run_dir, cfg)
    if wpath.is_dir():
        header = sharded_header(wpath, error=RunDirError)
    else:
        header = read_header([wpath], error=RunDirError)
    what = what or f"cannot load {str(run_dir)!r}"
    check_run_weights(kind, cfg["model"], header, what=what, error=RunDirError)


def _kind(run_dir: Path, cfg: dict) -> ModelKind:
    try:
        return get_kind(cfg["kind"])
    except UserError as err:
        raise RunDirError(f"{run_dir / 'config.json'}: {err}") from None


def _build(run_dir: Path, cfg: dict) -> tuple[ModelKind, nn.Module]:
    kind = _kind(run_dir, cfg)
    try:
        model = kind.config_cls.from_dict(cfg["model"])
        model = kind.build(model)
    except (TypeError, KeyError, ValueError) as err:
        raise RunDirError(
            f"{run_dir / 'config.json'}: model config does not fit kind {cfg['kind']!r}: {err}"
        ) from None
    return kind, model


#: ``quantize=`` choices of :func:`load`
QUANTIZE = ("int8",)
#: ``dtype=`` names accepted as strings
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(
    dtype: torch.dtype | str | None, quantize: str | None = None
) -> torch.dtype | None:
    """The parameter dtype for ``dtype`` (a ``torch.dtype`` or its name) and ``quantize``.

    Weight-only int8 runs with 16-bit activations unless told otherwise (``bfloat16`` when
    ``dtype`` is None): the CPU's int8 kernel is several times faster with them.

    Raises:
        UserError: an unknown dtype or quantisation.
    """
    if quantize is not None and quantize not in QUANTIZE:
        raise UserError(f"unknown quantization {quantize!r}; choose from {list(QUANTIZE)}")
    if dtype is None:
        return torch.bfloat16 if quantize == "int8" else None
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}; choose from {sorted(DTYPES)}")
    return DTYPES[dtype]


def load_model(
    run_dir: str | os.PathLike,
    *,
    weights: str = "best",
    map_location: str | torch.device = "cpu",
    dtype: torch.dtype | str | None = None,
    quantize: str | None = None,
) -> nn.Module:
    """Rebuild the model of a run directory from its config and weights (eval mode).

    config.json is checked against the weights' header first, on the ``meta`` device
    (:func:`check_config`): a config that disagrees with its weights, or asks for far more than
    they hold, is refused before anything is allocated.

    Args:
        weights: ``best`` (best.safetensors: the lowest validation loss; the last weights
            when no validation ran; the default, as in every command) or ``last``
            (model.safetensors), or a file name in the run directory.
        map_location: device for the weights.
        dtype: convert floating-point parameters to this dtype (``torch.bfloat16`` or
            ``"bfloat16"``...).
        quantize: ``"int8"``: weight-only int8 linear layers (:func:`attnlab.fast.quant.
            quantize_int8`), with bf16 activations unless ``dtype`` says otherwise.

    Raises:
        RunDirError: a missing or damaged run directory or weights file, or weights that do not
            fit the config.
        UserError: an unknown dtype or quantisation.
    """
    dtype = resolve_dtype(dtype, quantize)

    run_dir = Path(run_dir)
    cfg = read_config(run_dir)
    _kind(run_dir, cfg)  # an unknown kind is named before missing weights
    wpath = _weights_path(run_dir, weights)
    what = f"cannot load {str(run_dir)!r}"
    if wpath.is_dir():  # the newest weights are a sharded checkpoint's
        check_sharded_identity(wpath, cfg["kind"], cfg["model"], what)
    check_config(run_dir, cfg, wpath)  # before anything real is built
    kind, model = _build(run_dir, cfg)
    if wpath.is_dir():
        model.to(map_location)
        read_sharded_weights(model, wpath, f"cannot load {str(run_dir)!r}")
        return _cast(model, dtype, quantize).eval()
    try:
        state = load_file(wpath, device=str(map_location))
    except (SafetensorError, OSError, ValueError) as err:
        raise RunDirError(f"cannot read weights {wpath}: {err}") from None
    if kind.upgrade is not None:
        state = kind.upgrade(state)
    model.to(map_location)
    _load_state(model, state, wpath)
    return _cast(model, dtype, quantize).eval()


def _cast(model: nn.Module, dtype: torch.dtype | None, quantize: str | None = None) -> nn.Module:
    """Convert floating-point parameters to ``dtype``, then quantise (``"int8"``)."""
    if dtype is not None:
        for p in model.parameters():
            if p.is_floating_point():
                p.data = p.data.to(dtype)
    if quantize == "int8":
        quantize_int8(model)
    return model


def _load_state(model: nn.Module, state: dict, wpath: Path) -> None:
    """Load ``state`` into ``model``; tied weights may be stored under any one of their names."""
    expected = model.state_dict()
    # safetensors stores a tied tensor once, under one of its names: fill in the others
    groups: dict[int, list[str]] = {}
    for name, t in expected.items():
        groups.setdefault(t.data_ptr() if t.numel() else id(t), []).append(name)
    for names in groups.values():
        present = [n for n in names if n in state]
        if present and len(names) > 1:
            for n in names:
                state.setdefault(n, state[present[0]])
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise RunDirError(
            f"weights {wpath} do not match the model: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    for name, t in state.items():
        if tuple(t.shape) != tuple(expected[name].shape):
            raise RunDirError(
                f"weights {wpath}: {name} has shape {tuple(t.shape)}, the model expects "
                f"{tuple(expected[name].shape)}"
            )
    model.load_state_dict(state, strict=True)


# ----------------------------------------------------------------------------------------------
# what else a run holds: tokenizer, vocabularies, labels


def _read_tokenizer(run_dir: Path, cfg: dict) -> Any:
    # a run converted from a checkpoint without tokenizer.json still loads (tokenizer None)
    if not (run_dir / TOKENIZER_FILE).exists():
        return None
    return load_tokenizer(run_dir)


def _read_translation_vocab(run_dir: Path, cfg: dict) -> Any:
    return load_vocabs(run_dir)


def _read_scene_vocab(run_dir: Path, cfg: dict) -> Any:
    return Vocab.load(run_dir / "vocab.json")


def _read_labels(run_dir: Path, cfg: dict) -> Any:
    return ImageSettings.from_run(run_dir, cfg)


_ARTIFACT_READERS = {
    "tokenizer": _read_tokenizer,
    "translation_vocab": _read_translation_vocab,
    "scene_vocab": _read_scene_vocab,
    "labels": _read_labels,
    "none": lambda run_dir, cfg: None,
}


@dataclass
class LoadedRun:
    """Everything :func:`load` reads from a run directory.

    It unpacks as ``model, tokenizer = attnlab.load(run)``; ``tokenizer`` is what the kind reads
    and writes text or labels with: a tokenizer (LMs), the translation vocabularies, the scene
    vocabulary (captioning, VQA), or the image settings (classifiers: class names, image shape,
    normalisation); ``None`` for kinds without one.
    """

    model: nn.Module
    tokenizer: Any
    kind: str
    run_dir: Path
    config: dict = field(repr=False)
    weights: str = "best"

    @property
    def checkpoint(self) -> str:
        """Which checkpoint was read, in one line (:func:`describe_weights`)."""
        return describe_weights(self.run_dir, self.weights)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.model, self.tokenizer))

    def __getitem__(self, i: int) -> Any:
        return (self.model, self.tokenizer)[i]

    def __len__(self) -> int:
        return 2

    @property
    def task(self) -> dict:
        """config.json's ``task`` section (data settings), ``{}`` when absent."""
        return self.config.get("task") or {}

    @property
    def train(self) -> dict:
        """config.json's ``train`` section, ``{}`` when absent (converted checkpoints)."""
        return self.config.get("train") or {}


def load(
    run_dir: str | os.PathLike, *, kinds: tuple[str, ...] | None = None, **options: Any
) -> LoadedRun:
    """Load any run directory: ``model, tokenizer = attnlab.load(run)``.

    Args:
        run_dir: a directory written by ``attnlab train ...`` or ``attnlab convert``.
        weights: ``best`` (the default, as in every command: the lowest validation loss, or the
            last weights when no validation ran), ``last`` or a weights file name.
        map_location: device for the model.
        dtype: convert floating-point parameters (``torch.bfloat16`` or ``"bfloat16"`` for
            fast decoding: half the bytes to read per token).
        quantize: ``"int8"``: weight-only int8 linear layers, the output head included
            (a quarter of fp32's bytes), with bf16 activations unless ``dtype`` is given.
        kinds: accept only these model kinds (a command's check), refusing others by name.

    Returns:
        A :class:`LoadedRun` (model in eval mode, tokenizer/vocabulary/labels, kind, config).

    Raises:
        RunDirError: a missing, damaged or foreign run directory, or a kind not in ``kinds``.
        UserError: an unknown dtype or quantisation.
    """
    inspect.signature(load).bind(run_dir, kinds=kinds, **options)  # a misspelt option: TypeError
    run_dir = Path(run_dir)
    cfg = read_config(run_dir)
    if kinds is not None and cfg["kind"] not in kinds:
        raise RunDirError(
            f"{str(run_dir)!r} holds a {cfg['kind']!r} model; this needs one of {list(kinds)}"
        )
    model = load_model(run_dir, **options)
    kind = get_kind(cfg["kind"])
    tokenizer = _ARTIFACT_READERS[kind.artifacts](run_dir, cfg)
    return LoadedRun(model, tokenizer, cfg["kind"], run_dir, cfg, options.get("weights", "best"))


# load's options are load_model's (plus kinds): show them in help() and IDEs
load.__signature__ = inspect.signature(load_model).replace(
    parameters=[
        *inspect.signature(load_model).parameters.values(),
        inspect.signature(load).parameters["kinds"],
    ],
    return_annotation=LoadedRun,
)
