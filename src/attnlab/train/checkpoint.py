"""Run directories and checkpoints: what :func:`attnlab.train.train` reads, writes and locks.

A checkpoint is ``model.safetensors`` (and ``best.safetensors``), ``state.pt`` and
``metrics.jsonl``, written as one group (:class:`attnlab.fileio.AtomicFiles`): every file goes to
a temporary first and only then are they renamed, weights before state. A full disk, a read-only
file system or a signal in the middle leaves the previous checkpoint whole and consistent; a
write error becomes one :class:`RunWriteError` line naming the file, the cause and the checkpoint
that is kept.

``state.pt`` holds the optimizer, the schedule, the :class:`Progress` and the torch / CUDA /
Python / NumPy random states (:func:`attnlab.train.rng.capture_rng`); it is read back with
``torch.load(weights_only=True)``, which never runs code from the file.

While a run trains, its directory holds ``.attnlab.lock`` (:data:`LOCK_FILE`), an advisory lock
of the process training there (:class:`attnlab.fileio.DirectoryLock`): a second start on the same
directory is refused, naming the holder; a lock left by a killed process is taken over.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_model
from torch import nn

from attnlab import dcp_files, fileio
from attnlab.errors import RunDirError, UserError
from attnlab.fileio import (
    AtomicFiles,
    DirectoryLock,
    LockHeld,
    check_writable,
    describe_holder,
    lock_holder,
    remove_temporaries,
)
from attnlab.runs import check_resumable
from attnlab.train import distributed as dist_utils
from attnlab.train.curves import plot_curves

__all__ = [
    "CONFIG_FILE",
    "LAST_FILE",
    "BEST_FILE",
    "STATE_FILE",
    "METRICS_FILE",
    "CURVE_FILE",
    "LOCK_FILE",
    "RunWriteError",
    "Progress",
    "check_run_dir",
    "lock_run_dir",
    "run_lock",
    "clear_run_dir",
    "writing",
    "save_weights",
    "start_run",
    "write_checkpoint",
    "write_metrics",
    "plot_loss",
    "read_state",
]

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
LAST_FILE = "model.safetensors"
BEST_FILE = "best.safetensors"
STATE_FILE = "state.pt"
METRICS_FILE = "metrics.jsonl"
CURVE_FILE = "loss.png"
LOCK_FILE = ".attnlab.lock"
_RUN_FILES = (CONFIG_FILE, LAST_FILE, BEST_FILE, STATE_FILE, METRICS_FILE, CURVE_FILE)


class RunWriteError(UserError):
    """A file of the run could not be written (full disk, read-only, no permission).

    The message is one line: the file, the cause, and which checkpoint is kept. ``path`` and
    ``errno`` give the same to a program.
    """

    def __init__(self, message: str, path: str | None = None, code: int | None = None):
        super().__init__(message)
        self.path = path
        self.errno = code


@dataclass
class Progress:
    """The part of the loop's state that goes into state.pt besides optimizer and RNG."""

    step: int = 0  # optimizer steps completed
    elapsed: float = 0.0  # wall-clock seconds of training so far (all sessions)
    tokens: int = 0  # task.count summed over all steps and ranks
    best_val_loss: float | None = None
    val_loss: float | None = None
    train_loss: float | None = None
    last_eval_step: int = -1
    last_ckpt_step: int = -1
    finished: bool = False  # the run reached its length or budget (train/stopping.py)


# ----------------------------------------------------------------------------------------------
# the run directory and its lock


def _kept(step: int) -> str:
    if step < 0:
        return "no checkpoint had been written yet"
    return f"the previous checkpoint, step {step}, is kept"


@contextlib.contextmanager
def writing(what: str, kept_step: int) -> Iterator[None]:
    """Turn an OSError while writing ``what`` into one :class:`RunWriteError` line.

    Args:
        what: the kind of file (``"checkpoint"``, ``"metrics"``, ``"loss curve"``...).
        kept_step: the step of the checkpoint that survives the failure (-1: none).

    Raises:
        RunWriteError: ``cannot write checkpoint runs/x/model.safetensors: No space left on
            device (the previous checkpoint, step 200, is kept)``.
    """
    try:
        yield
    except OSError as err:
        path = err.filename if err.filename is not None else "?"
        cause = err.strerror or str(err)
        raise RunWriteError(
            f"cannot write {what} {path}: {cause} ({_kept(kept_step)})", str(path), err.errno
        ) from None


def _not_writable(run_dir: Path, err: OSError) -> RunDirError:
    return RunDirError(
        f"cannot write to run directory {str(run_dir)!r}: {err.strerror or err}; choose a "
        "writable --out"
    )


def _in_use(run_dir: Path, holder: dict | None) -> RunDirError:
    return RunDirError(
        f"run directory {str(run_dir)!r} is in use by another attnlab process "
        f"({describe_holder(holder)}); wait for it to end, or choose another --out"
    )


def _holds_files(run_dir: Path) -> bool:
    """Anything but the lock file, the lock file being written, and a writability probe (under
    torchrun the ranks check the same directory at once: rank 0 taking the lock, or one rank's
    probe, must not make it look taken to another)."""
    return any(
        p.name != LOCK_FILE and not fileio.is_temporary(p.name, (LOCK_FILE,))
        for p in run_dir.iterdir()
    )


def check_run_dir(
    run_dir: str | Path, resume: bool = False, overwrite: bool = False, *, check_lock: bool = True
) -> None:
    """Refuse to clobber an existing run or one in use; check that a resume has something to resume.

    :func:`attnlab.train.train` calls it first; a command can call it earlier, before slow
    preparations. A directory holding nothing but a lock file counts as empty.

    Args:
        run_dir: the run directory (``--out``).
        resume: a resume is planned: it needs a checkpoint.
        overwrite: an overwrite is planned: it needs an attnlab run (or nothing) there.
        check_lock: also refuse a directory whose lock a live process holds (looked at only
            in rank 0 under torchrun: rank 0 takes the lock).

    Raises:
        RunDirError: ``run_dir`` is in use by another process (its lock is held), cannot be
            written (read-only, no permission), holds a run (and neither ``resume`` nor
            ``overwrite``), is not a directory, is not an attnlab run (``overwrite``), or has no
            checkpoint (``resume``).
        UserError: both ``resume`` and ``overwrite``.
    """
    run_dir = Path(run_dir)
    if resume and overwrite:
        raise UserError("choose one of --resume (continue the run) and --overwrite (start again)")
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"run directory {str(run_dir)!r} exists and is not a directory")
    # under torchrun only rank 0 looks at (and later takes) the lock
    if check_lock and os.environ.get("RANK", "0") == "0" and run_dir.is_dir():
        holder = lock_holder(run_dir / LOCK_FILE)
        if holder is not None:
            raise _in_use(run_dir, holder)
    try:
        check_writable(run_dir)
    except OSError as err:
        raise _not_writable(run_dir, err) from None
    if resume:
        missing = [f for f in (CONFIG_FILE, LAST_FILE, STATE_FILE) if not (run_dir / f).exists()]
        if dcp_files.last_sharded(run_dir) is not None:  # an FSDP run's checkpoint
            missing = [f for f in missing if f == CONFIG_FILE]
        if missing:
            raise RunDirError(
                f"cannot resume {str(run_dir)!r}: no checkpoint there (missing "
                f"{', '.join(missing)})"
            )
        check_resumable(run_dir)  # config.json against the weights, before any build
        return
    if run_dir.exists() and _holds_files(run_dir):
        if not overwrite:
            raise RunDirError(
                f"run directory {str(run_dir)!r} already exists; resume it "
                "(--resume) or start again in its place (--overwrite)"
            )
        if not (run_dir / CONFIG_FILE).exists():
            raise RunDirError(
                f"refusing to overwrite {str(run_dir)!r}: it is not an attnlab run "
                "directory (no config.json)"
            )


def lock_run_dir(run_dir: Path) -> DirectoryLock:
    """Create ``run_dir`` if needed and take its lock for this process.

    Temporary files that a killed writer left behind are removed (nobody else writes there now).

    Raises:
        RunDirError: another live process holds the lock (the message names its pid, host,
            start time and command), or the directory cannot be written.
    """
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        lock = DirectoryLock.acquire(run_dir / LOCK_FILE)
    except LockHeld as err:
        raise _in_use(run_dir, err.holder) from None
    except OSError as err:
        raise _not_writable(run_dir, err) from None
    if not lock.enforced:
        log.warning(
            "cannot lock %s (no advisory locks here): concurrent starts go undetected", run_dir
        )
    if lock.previous is not None:
        log.warning(
            "%s: taking over the lock of a process that is gone (%s)",
            run_dir,
            describe_holder(lock.previous),
        )
    remove_temporaries(run_dir, _RUN_FILES)
    _remove_partial_sharded(run_dir)
    return lock


def _remove_partial_sharded(run_dir: Path) -> None:
    """Delete the folders of sharded checkpoints whose writing a killed run left unfinished."""
    root = run_dir / dcp_files.SHARDED_DIR
    if not root.is_dir():
        return
    for entry in root.iterdir():
        if entry.name.startswith(".step-"):  # .step-N.tmp (being written), .step-N.old (replaced)
            log.info("%s: removing the unfinished checkpoint %s", run_dir, entry.name)
            shutil.rmtree(entry, ignore_errors=True)


@contextlib.contextmanager
def run_lock(run_dir: Path, main: bool, device: torch.device) -> Iterator[None]:
    """Rank 0 holds the run directory's lock for the block; every rank learns if it failed."""
    created = main and not run_dir.exists()
    lock, error = None, None
    if main:
        try:
            lock = lock_run_dir(run_dir)
        except RunDirError as err:
            error = err
    if not dist_utils.broadcast_ok(error is None, device):
        if error is not None:
            raise error
        raise RunDirError(f"rank 0 could not lock the run directory {str(run_dir)!r}")
    try:
        yield
    finally:
        if lock is not None:
            lock.release()
            if created:  # a start that failed before writing anything leaves nothing behind
                with contextlib.suppress(OSError):
                    run_dir.rmdir()


def clear_run_dir(run_dir: Path) -> None:
    """Delete everything in ``run_dir`` but its lock (``--overwrite``, lock held)."""
    for entry in run_dir.iterdir():
        if entry.name == LOCK_FILE:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


# ----------------------------------------------------------------------------------------------
# writing


def _weights_writer(model: nn.Module, step: int):
    return lambda tmp: save_model(model, tmp, metadata={"step": str(step)})


def save_weights(model: nn.Module, path: Path, step: int) -> None:
    """Save ``model``'s weights (safetensors, atomically), with ``step`` in the metadata."""
    fileio.atomic_save(path, _weights_writer(model, step))


class _WholeWrites:
    """A file whose ``write`` writes every byte or raises the OSError.

    ``torch.save`` to a path reports a full disk as an opaque ``RuntimeError`` ("unexpected pos")
    and ignores short writes; through this object the OSError reaches the caller.
    """

    def __init__(self, fd: int):
        self.fd = fd

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            done += os.write(self.fd, view[done:])
        return len(view)

    def flush(self) -> None:
        pass


def _torch_save(obj: object, path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        torch.save(obj, _WholeWrites(fd))
    finally:
        os.close(fd)


def _metrics_text(history: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in history)


def write_checkpoint(
    run_dir: Path, model: nn.Module, state: dict, history: list[dict], *, best: bool, kept: int
) -> None:
    """Write last (and best) weights, state.pt and metrics.jsonl as one group.

    Args:
        state: ``{"progress", "optimizer", "schedule", "rng"}``; its progress step goes into the
            weights' metadata, which a resume compares.
        kept: the step of the checkpoint on disk now (named if this one fails).

    Raises:
        RunWriteError: a file could not be written; nothing of this checkpoint is on disk.
    """
    step = state["progress"]["step"]
    with writing("checkpoint", kept), AtomicFiles() as files:
        files.save(run_dir / LAST_FILE, _weights_writer(model, step))
        if best:
            files.save(run_dir / BEST_FILE, _weights_writer(model, step))
        files.save(run_dir / STATE_FILE, lambda tmp: _torch_save(state, tmp))
        files.write_text(run_dir / METRICS_FILE, _metrics_text(history))


def plot_loss(run_dir: Path, kept: int) -> None:
    """Draw loss.png from metrics.jsonl.

    Raises:
        RunWriteError: it could not be written (``kept``: the checkpoint on disk).
    """
    with writing("loss curve", kept):
        plot_curves(run_dir / METRICS_FILE, run_dir / CURVE_FILE)


def write_metrics(run_dir: Path, history: list[dict], kept: int) -> None:
    """Rewrite metrics.jsonl (between checkpoints).

    Raises:
        RunWriteError: it could not be written.
    """
    with writing("metrics", kept):
        fileio.atomic_write_text(run_dir / METRICS_FILE, _metrics_text(history))


def start_run(run_dir: Path, task: Any, config: dict, resume: bool, kept: int) -> None:
    """Rank 0: write config.json and (a new run) the task's files (tokenizer, vocabulary...).

    Raises:
        RunWriteError: a file could not be written (``kept``: the checkpoint on disk, -1: none).
    """
    with writing("run config", kept):
        fileio.atomic_write_text(run_dir / CONFIG_FILE, json.dumps(config, indent=2) + "\n")
    if not resume:
        with writing("run file", kept):
            task.save_artifacts(run_dir)


# ----------------------------------------------------------------------------------------------
# reading (the resume itself: attnlab.train.resume)


# torch.load(weights_only=True) runs no code from the file only from these versions on
# (CVE-2025-32434 fixed in 2.6, CVE-2026-24747 in 2.10)
_SAFE_LOADER = (2, 10)


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def read_state(path: Path) -> dict:
    """Read a ``state.pt`` with ``torch.load(weights_only=True)`` (no code from the file runs).

    Raises:
        RunDirError: the file is damaged or not a training state.
    """
    if _torch_version() < _SAFE_LOADER:
        log.warning(
            "torch %s: its weights_only loader has known code-execution flaws (fixed in 2.6 and "
            "2.10); resume only runs you trust, or upgrade torch",
            torch.__version__,
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # pickle / zip errors of a damaged file
        # torch's own message is pages long and suggests weights_only=False: do not pass it on
        raise RunDirError(
            f"cannot read {path}: the file is damaged or not an attnlab training state "
            f"({type(err).__name__})"
        ) from None
