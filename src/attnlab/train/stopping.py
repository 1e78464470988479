"""Stopping and resuming a run: where it stopped, whether it is complete, what changed.

``attnlab train KIND --resume --out RUN`` continues the saved run with its own settings (the
run's config.json) to its own length or time budget; a new length is typed explicitly
(``--steps`` / ``--max-time``). What the command line needs for that lives here:

- :class:`StopInfo`, which the trainer attaches to a ``KeyboardInterrupt`` / ``Terminated`` as
  ``err.stopped`` (the step, the checkpoint saved, the budget used), so ``attnlab`` can print one
  message with the exact command to resume;
- :func:`completion`, the "already complete" check a command makes before preparing its data.

(Loading a checkpoint and the warnings about a resume with other settings: :mod:`.resume`.)
"""

from __future__ import annotations

import logging
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnlab import runs
from attnlab.train.config import TrainConfig

__all__ = ["StopInfo", "saved_progress", "completion", "resume_command"]

log = logging.getLogger(__name__)


def resume_command(kind: str, run_dir: str | Path) -> str:
    """``attnlab train KIND --resume --out RUN`` (quoted for a shell)."""
    return f"attnlab train {kind} --resume --out {shlex.quote(str(run_dir))}"


@dataclass
class StopInfo:
    """Where an interrupted training stopped (``err.stopped`` of its KeyboardInterrupt).

    Attributes:
        run_dir: the run directory.
        step: optimizer steps completed.
        saved_step: the step of the checkpoint on disk (-1: none).
        cfg: the run's training settings (for its length or budget).
        elapsed: seconds of the run so far (all sessions).
    """

    run_dir: Path
    step: int
    saved_step: int
    cfg: TrainConfig
    elapsed: float

    @classmethod
    def of(cls, loop: Any) -> StopInfo:
        """Where the trainer's loop (``attnlab.train.trainer._Loop``) stands now."""
        prog = loop.prog
        return cls(loop.run_dir, prog.step, prog.last_ckpt_step, loop.cfg, loop.elapsed())

    def describe(self, kind: str | None = None) -> str:
        """``at step 9 of 24; checkpoint of step 9 saved in runs/x; resume with: ...``.

        Args:
            kind: the ``attnlab train`` sub-command, for the resume command (None: no command).
        """
        if self.cfg.timed:
            where = (
                f"at step {self.step} ({self.elapsed:.0f} s of the {self.cfg.max_time:g} s budget)"
            )
        else:
            where = f"at step {self.step} of {self.cfg.steps}"
        if self.saved_step < 0:
            return f"{where}; no checkpoint was saved"
        if self.saved_step == self.step:
            saved = f"checkpoint saved in {self.run_dir}"
        else:
            saved = f"the last checkpoint, step {self.saved_step}, is in {self.run_dir}"
        text = f"{where}; {saved}"
        if kind is not None:
            text += f"; resume with: {resume_command(kind, self.run_dir)}"
        return text


def saved_progress(run_dir: str | Path) -> dict[str, Any] | None:
    """The progress record of a run's ``state.pt`` (step, elapsed, finished...), or None.

    Read with ``torch.load(weights_only=True, mmap=True)``: nothing in the file is executed and
    the optimizer state is not read into memory.
    """
    path = Path(run_dir) / "state.pt"
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return dict(state["progress"])
    except Exception:  # a damaged file: the trainer's resume reports it properly
        return None


def completion(run_dir: str | Path, cfg: TrainConfig) -> str | None:
    """The message for resuming a run that has already reached ``cfg``'s length, or None.

    A step-counted run is complete at ``cfg.steps``; a timed run once a session ended on its
    budget (and ``cfg.max_time`` is not larger than that run's) or its clock is past
    ``cfg.max_time``.
    """
    prog = saved_progress(run_dir)
    if prog is None:
        return None
    step, elapsed = int(prog.get("step", 0)), float(prog.get("elapsed", 0.0))
    if cfg.timed:
        saved = (runs.read_config(run_dir).get("train") or {}).get("max_time")
        budget_spent = prog.get("finished", False) and saved is not None and cfg.max_time <= saved
        if not (budget_spent or elapsed >= cfg.max_time):
            return None
        length = f"its {cfg.max_time:g} s budget ({step} steps)"
        longer = "a larger --max-time"
    else:
        if step < cfg.steps:
            return None
        length = f"{step} of {cfg.steps} steps"
        longer = "a larger --steps"
    val = prog.get("val_loss")
    val_text = "" if val is None else f", last validation loss {val:.4f}"
    return (
        f"{run_dir} is already complete: {length}{val_text}. Nothing to do; to train it further, "
        f"resume with {longer} (a cosine or wsd schedule has decayed already: constant and "
        "inverse_sqrt schedules continue seamlessly)"
    )
