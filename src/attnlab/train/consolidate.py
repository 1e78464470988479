"""Gathering the newest sharded (FSDP) checkpoint of a run into its ``model.safetensors``, in
one process (``attnlab convert --consolidate RUN``), for a run that stopped before its end."""

from __future__ import annotations

from pathlib import Path

from attnlab.errors import RunDirError
from attnlab.runs import last_sharded, load_model, newest_weights, read_config, weights_step
from attnlab.train.checkpoint import LAST_FILE, lock_run_dir, save_weights

__all__ = ["consolidate"]


def consolidate(run: str | Path) -> str:
    """Write ``run/model.safetensors`` from the run's newest sharded checkpoint (under the run's
    lock: not while a training writes there).

    Returns:
        What was done, in one line (nothing when the weights file is already the newest).

    Raises:
        RunDirError: not a run, or a run with neither weights nor a sharded checkpoint.
    """
    run = Path(run)
    read_config(run)
    lock = lock_run_dir(run)
    try:
        source = newest_weights(run)
        if not source.is_dir():
            if not source.exists():
                raise RunDirError(f"{str(run)!r} has neither weights nor a sharded checkpoint")
            return (
                f"{run}: {LAST_FILE} already holds the newest weights (step {weights_step(source)})"
            )
        step = last_sharded(run)[0]
        model = load_model(run, weights="last")  # the sharded checkpoint: DCP reassembles it
        save_weights(model, run / LAST_FILE, step)
    finally:
        lock.release()
    n = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    return f"consolidated {source} ({n:,} parameters, step {step}) into {run / LAST_FILE}"
