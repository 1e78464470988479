"""Sharded checkpoints on disk (``torch.distributed.checkpoint``, written by an FSDP run), found
and read in one process: which folders are complete, which weights of a run are the newest, and
reading the model part into a whole model. The trainer writes them (:mod:`attnlab.train.sharded`);
:func:`attnlab.load` reads them.

A run directory's sharded checkpoints are ``checkpoints/step-N/`` folders, each with one file per
rank, DCP's ``.metadata`` (written last) and ``checkpoint.json`` naming the model.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

from safetensors import safe_open
from torch import nn

from attnlab.errors import RunDirError

__all__ = [
    "LAST_WEIGHTS",
    "SHARDED_DIR",
    "SHARDED_META",
    "sharded_checkpoints",
    "last_sharded",
    "weights_step",
    "read_sharded_weights",
    "newest_weights",
    "sharded_mismatch",
    "check_sharded_identity",
    "first_failure",
    "single_process_dcp",
]

#: a run's last weights
LAST_WEIGHTS = "model.safetensors"
#: the folder of a run's sharded checkpoints (``checkpoints/step-00000200/``)
SHARDED_DIR = "checkpoints"
SHARDED_META = "checkpoint.json"
_STEP_DIR = re.compile(r"step-(\d+)\Z")


def weights_step(path: str | os.PathLike) -> int | None:
    """The training step in a safetensors file's metadata (``None``: none recorded)."""
    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
    return int(meta["step"]) if "step" in meta else None


def sharded_checkpoints(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """The complete sharded checkpoints of a run, ``(step, folder)``, oldest first.

    Complete: renamed to ``step-N`` (a write in progress has another name) and holding DCP's
    ``.metadata`` (written last, by rank 0, once every rank's file is done) and
    ``checkpoint.json``.
    """
    root = Path(run_dir) / SHARDED_DIR
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        m = _STEP_DIR.match(entry.name)
        if m and (entry / ".metadata").is_file() and (entry / SHARDED_META).is_file():
            found.append((int(m.group(1)), entry))
    return sorted(found)


def last_sharded(run_dir: str | os.PathLike) -> tuple[int, Path] | None:
    """The newest complete sharded checkpoint ``(step, folder)``, or ``None``."""
    found = sharded_checkpoints(run_dir)
    return found[-1] if found else None


def newest_weights(run_dir: str | os.PathLike) -> Path:
    """The run's last weights: ``model.safetensors``, or the newer sharded checkpoint's folder.

    A run trained with ``--strategy fsdp`` writes ``model.safetensors`` at its end; one that
    stopped before has only its sharded checkpoints (or an older ``model.safetensors``).
    """
    run_dir = Path(run_dir)
    last = run_dir / LAST_WEIGHTS
    sharded = last_sharded(run_dir)
    if sharded is None:
        return last
    if last.exists():
        try:
            step = weights_step(last)
        except Exception:  # a damaged file: the sharded checkpoint is the readable one
            step = None
        if step is not None and step >= sharded[0]:
            return last
    return sharded[1]


def sharded_mismatch(folder: Path, shapes: dict[str, tuple[int, ...]], prefix: str) -> str | None:
    """How a sharded checkpoint's tensors ``prefix + name`` differ from ``shapes`` (None: fit)."""
    # lazy: torch.distributed.checkpoint takes ~1.5 s to import; only sharded runs need it
    from torch.distributed.checkpoint import FileSystemReader

    try:
        meta = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    except Exception as err:  # a damaged .metadata
        return f"its .metadata cannot be read ({type(err).__name__}: {err})"
    saved = {
        k[len(prefix) :]: tuple(v.size)
        for k, v in meta.items()
        if k.startswith(prefix) and hasattr(v, "size")
    }
    missing = sorted(set(shapes) - set(saved))
    unexpected = sorted(set(saved) - set(shapes))
    if missing or unexpected:
        return f"missing {missing[:5]}, unexpected {unexpected[:5]}"
    for name, shape in shapes.items():
        if tuple(shape) != saved[name]:
            return f"{name} has shape {saved[name]} there, {tuple(shape)} in the model"
    return None


@contextlib.contextmanager
def single_process_dcp() -> Iterator[None]:
    """Silence DCP's warning that a load or save without a process group is a local one: that
    is what is meant here (one process reads a checkpoint that several ranks wrote)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def first_failure(err: BaseException) -> BaseException:
    """The first rank's exception inside DCP's ``CheckpointException`` (else ``err``)."""
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        return first[0] if isinstance(first, tuple) else first
    return err


def check_sharded_identity(folder: Path, kind: str, model_cfg: dict, what: str) -> None:
    """Refuse a sharded checkpoint written for another kind of model or another model config.

    Raises:
        RunDirError: naming the differing config keys.
    """
    try:
        meta = json.loads((folder / SHARDED_META).read_text())
    except (OSError, ValueError) as err:
        raise RunDirError(f"{what}: cannot read {folder / SHARDED_META}: {err}") from None
    if meta.get("kind") != kind:
        raise RunDirError(
            f"{what}: the sharded checkpoint {folder} holds a {meta.get('kind')!r} model, not "
            f"{kind!r}"
        )
    saved = meta.get("model") or {}
    cfg = json.loads(json.dumps(model_cfg))
    diff = sorted(k for k in set(saved) | set(cfg) if saved.get(k) != cfg.get(k))
    if diff:
        raise RunDirError(
            f"{what}: the sharded checkpoint {folder} is from another model (its config differs "
            f"in {diff[:8]})"
        )


def read_sharded_weights(model: nn.Module, folder: Path, what: str) -> None:
    """Load the model part of a sharded checkpoint into a whole (unsharded) ``model``, here.

    DCP reassembles each tensor from the shards every rank wrote, whatever their number.

    Raises:
        RunDirError: the checkpoint's tensors do not fit the model (named).
    """
    # lazy: torch.distributed.checkpoint takes ~1.5 s to import; only sharded runs need it
    import torch.distributed.checkpoint as dcp

    state = model.state_dict()
    problem = sharded_mismatch(folder, {k: tuple(v.shape) for k, v in state.items()}, "model.")
    if problem:
        raise RunDirError(
            f"{what}: the sharded checkpoint {folder} does not fit the model: {problem}"
        )
    from torch.distributed.checkpoint.api import CheckpointException  # lazy, as dcp above

    try:
        with single_process_dcp():
            dcp.load({"model": state}, checkpoint_id=str(folder), no_dist=True)
    except (Exception, CheckpointException) as err:  # (a BaseException) the readers' failures
        raise RunDirError(
            f"{what}: cannot read the sharded checkpoint {folder}: {first_failure(err)}"
        ) from None
    model.load_state_dict(state)
