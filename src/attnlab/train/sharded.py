"""Sharded checkpoints of an FSDP run (``torch.distributed.checkpoint``, DCP), written by every rank.

One checkpoint is one folder, ``checkpoints/step-00000200/`` in the run directory::

    __0_0.distcp, __1_0.distcp, ...   each rank's shards of the model and of the optimizer state
    .metadata                         every tensor's global shape and which file holds which slice
    state.pt                          progress, schedule and rank 0's random state (small)
    checkpoint.json                   {"step", "kind", "model", "world"}: whose checkpoint it is

Atomic at the folder level: the ranks write into ``checkpoints/.step-00000200.tmp``; ``dcp.save``
returns once rank 0 has written ``.metadata`` after every rank's file; rank 0 then adds
``state.pt`` and ``checkpoint.json``, writes ``metrics.jsonl``, renames the folder to
``step-00000200`` and only then deletes the previous checkpoint. A kill or a full disk at any
moment leaves the previous checkpoint whole; the temporary folder is removed when the run
directory is next locked.

Resharding: DCP records each tensor's global shape and the slice each file holds, so a
checkpoint of N ranks loads into a model sharded over M ranks, or into a whole model in one
process, each rank reading the slices it needs. The optimizer state goes through
``torch.distributed.checkpoint.state_dict``, keyed by parameter name, and reshards the same way.
The end of a run (and ``attnlab convert --consolidate``) gathers a plain ``model.safetensors``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch import nn

from attnlab import dcp_files
from attnlab.errors import RunDirError
from attnlab.fileio import atomic_save, atomic_write_text
from attnlab.train import distributed as dist_utils
from attnlab.train.checkpoint import (
    BEST_FILE,
    METRICS_FILE,
    RunWriteError,
    _kept,
    _metrics_text,
    _torch_save,
    read_state,
    writing,
)
from attnlab.train.fsdp import full_state_dict, param_names

__all__ = [
    "save_sharded",
    "load_sharded",
    "load_full_into_sharded",
    "write_consolidated",
    "remove_sharded",
]

log = logging.getLogger(__name__)

STATE_NAME = "state.pt"


def _write_error(err: BaseException, path: Path, kept: int):
    err = dcp_files.first_failure(err)
    if isinstance(err, OSError):
        where = err.filename if err.filename is not None else path
        cause = err.strerror or str(err)
    else:
        where, cause = path, f"{type(err).__name__}: {err}"
    return RunWriteError(
        f"cannot write checkpoint {where}: {cause} ({_kept(kept)})",
        str(where),
        getattr(err, "errno", None),
    )


def _agree(error: BaseException | None, device: torch.device, kept: int) -> None:
    """Raise on every rank when rank 0 failed (others learn it through a broadcast)."""
    if dist_utils.broadcast_ok(error is None, device):
        return
    if error is not None:
        raise error
    raise RunWriteError(f"rank 0 could not write the checkpoint ({_kept(kept)})")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _rmtree(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)


def _publish(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` to ``final``, then delete every older checkpoint (rank 0)."""
    root = final.parent
    aside = root / f".{final.name}.old"
    if final.exists():  # the same step again (a resumed run's final save): keep it until replaced
        _rmtree(aside)
        os.replace(final, aside)
    os.replace(tmp, final)
    _fsync_dir(root)
    for _step, folder in dcp_files.sharded_checkpoints(root.parent):
        if folder != final:
            _rmtree(folder)
    _rmtree(aside)


def save_sharded(
    run_dir: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict,
    meta: dict,
    history: list[dict],
    *,
    best: bool,
    kept: int,
    main: bool,
    device: torch.device,
) -> Path:
    """Every rank: write the sharded checkpoint of step ``meta["step"]`` (a collective).

    Args:
        state: ``{"progress", "schedule", "rng"}`` (rank 0's), saved as ``state.pt``.
        meta: ``{"step", "kind", "model", "world"}``, saved as ``checkpoint.json``.
        history: the metrics records, written to ``metrics.jsonl`` before the checkpoint is
            published.
        best: also gather the weights into ``best.safetensors`` (the validation loss improved).
        kept: the step of the checkpoint on disk now (named if this one fails).

    Returns:
        The checkpoint's folder.

    Raises:
        RunWriteError: on every rank, when any rank could not write its part; the previous
            checkpoint is kept whole.
    """
    # lazy: torch.distributed.checkpoint takes ~1.5 s to import; only sharded runs need it
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict

    root = run_dir / dcp_files.SHARDED_DIR
    name = f"step-{meta['step']:08d}"
    tmp, final = root / f".{name}.tmp", root / name
    error: BaseException | None = None
    if main:
        try:
            root.mkdir(exist_ok=True)
            _rmtree(tmp)  # a killed attempt at the same step
            tmp.mkdir()
        except OSError as err:
            error = _write_error(err, tmp, kept)
    _agree(error, device, kept)
    model_state, optim_state = get_state_dict(model, optimizer)
    try:
        with dcp_files.single_process_dcp():
            dcp.save(
                {"model": model_state, "optim": optim_state},
                checkpoint_id=str(tmp),
                no_dist=not dist.is_initialized(),
            )
    except (Exception, CheckpointException) as err:  # (CheckpointException: a BaseException)
        raise _write_error(err, tmp, kept) from None
    error = None
    if main:
        try:
            with writing("checkpoint", kept):
                atomic_save(tmp / STATE_NAME, lambda t: _torch_save(state, t))
                atomic_write_text(tmp / dcp_files.SHARDED_META, json.dumps(meta, indent=1) + "\n")
                atomic_write_text(run_dir / METRICS_FILE, _metrics_text(history))
                _publish(tmp, final)
                (run_dir / STATE_NAME).unlink(missing_ok=True)  # an unsharded phase's, now stale
        except Exception as err:  # RunWriteError
            error = err
    _agree(error, device, kept)
    if best:
        path = run_dir / BEST_FILE
        write_consolidated(path, model, meta["step"], main=main, device=device, kept=kept)
    return final


def _check_fit(folder: Path, model_state: dict, what: str) -> None:
    shapes = {k: tuple(v.shape) for k, v in model_state.items()}
    problem = dcp_files.sharded_mismatch(folder, shapes, "model.")
    if problem:
        raise RunDirError(
            f"{what}: the sharded checkpoint {folder} does not fit the model: {problem}"
        )


def load_sharded(
    folder: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    kind: str,
    model_cfg: dict,
    what: str,
) -> dict:
    """Every rank: load a sharded checkpoint into ``model`` and ``optimizer`` (sharded or not).

    Returns:
        ``state.pt`` of the checkpoint: ``{"progress", "schedule", "rng"}``.

    Raises:
        RunDirError: the checkpoint is from another model (config or tensor shapes, named), or
            cannot be read.
    """
    # lazy: torch.distributed.checkpoint takes ~1.5 s to import; only sharded runs need it
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    dcp_files.check_sharded_identity(folder, kind, model_cfg, what)
    state = read_state(folder / STATE_NAME)
    model_state, optim_state = get_state_dict(model, optimizer)
    _check_fit(folder, model_state, what)
    both = {"model": model_state, "optim": optim_state}
    try:
        with dcp_files.single_process_dcp():
            dcp.load(both, checkpoint_id=str(folder), no_dist=not dist.is_initialized())
    except (Exception, CheckpointException) as err:
        raise RunDirError(
            f"{what}: cannot read the sharded checkpoint {folder}: {dcp_files.first_failure(err)}"
        ) from None
    set_state_dict(model, optimizer, model_state_dict=both["model"], optim_state_dict=both["optim"])
    return state


def load_full_into_sharded(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    weights: dict,
    optim_state: dict,
    what: str,
) -> None:
    """Load a whole checkpoint (``model.safetensors`` + ``state.pt`` of a DDP or one-process run)
    into a sharded model and its optimizer: each rank keeps its shards.

    Raises:
        RunDirError: the weights or the optimizer state do not fit.
    """
    # lazy: torch.distributed.checkpoint takes ~1.5 s to import; only sharded runs need it
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    for names in param_names(model).values():  # a tied tensor is stored under one name
        present = [n for n in names if n in weights]
        for n in names:
            if present:
                weights.setdefault(n, weights[present[0]])
    order = [n for g in optimizer.param_groups for n in g.get("names", [])]
    saved_groups = optim_state.get("param_groups", [])
    n_saved = sum(len(g["params"]) for g in saved_groups)
    if n_saved != len(order):
        raise RunDirError(
            f"{what}: the optimizer state holds {n_saved} parameters, the model {len(order)}"
        )
    index = dict(enumerate(order))
    named = {
        "state": {index[i]: s for i, s in optim_state["state"].items()},
        "param_groups": [{**g, "params": [index[i] for i in g["params"]]} for g in saved_groups],
    }
    try:
        set_state_dict(
            model,
            optimizer,
            model_state_dict=weights,
            optim_state_dict=named,
            options=StateDictOptions(full_state_dict=True),
        )
    except (KeyError, RuntimeError, ValueError) as err:
        raise RunDirError(f"{what}: the checkpoint does not fit the model: {err}") from None


def write_consolidated(
    path: Path, model: nn.Module, step: int, *, main: bool, device: torch.device, kept: int
) -> None:
    """Every rank: gather the weights and (rank 0) write them to ``path`` as safetensors."""
    weights = full_state_dict(model)  # a collective; {} on the other ranks
    error = None
    if main:
        try:
            with writing("checkpoint", kept):
                tensors = {k: v.contiguous() for k, v in weights.items()}
                atomic_save(path, lambda t: save_file(tensors, t, metadata={"step": str(step)}))
        except Exception as err:  # RunWriteError
            error = err
    _agree(error, device, kept)


def remove_sharded(run_dir: Path) -> None:
    """Delete the sharded checkpoints (rank 0, once a whole checkpoint supersedes them)."""
    _rmtree(run_dir / dcp_files.SHARDED_DIR)
