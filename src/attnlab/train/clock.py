"""The wall-clock budget of a timed run (``max_time``): what a person waits, validation included.

The rule (docs/training.md):

- The clock starts when the command starts (``attnlab`` calls :func:`count_from` first thing, so
  importing torch and preparing the data count) or, from Python, when :func:`attnlab.train.train`
  is called; a resumed run adds the seconds of its earlier sessions.
- Every validation and checkpoint is inside the budget. To leave room for the final one, the loop
  stops once ``elapsed + one step + reserve >= max_time``, where ``reserve`` is the longest
  validation + checkpoint of the session so far (the final one, with the last loss curve, can
  take longer than a typical one). A timed run therefore validates when a session starts (step 0, or
  the step it resumes from, unless that step was validated already): that measures the reserve
  before it is needed, and puts the initial loss on the curve.
- The learning-rate schedule runs on ``(elapsed + one step) / (max_time - reserve)``, so it ends
  with the last step, not in the reserve.
- Every fresh run takes at least one step, even if the start-up alone used the budget.

What is left over is the time to write the last loss curve and print the result (well under a
second), plus, when validation costs more than half the budget, the overrun of the final one
(the trainer warns: lower ``eval_batches``).
"""

from __future__ import annotations

import logging
import time

from attnlab.plotting import pyplot
from attnlab.train.config import TrainConfig
from attnlab.train.distributed import broadcast_float

__all__ = ["Budget", "after_step", "count_from", "schedule_point", "session_start"]

log = logging.getLogger(__name__)

_started_at: float | None = None

#: what the first checkpoint is assumed to cost before one has been timed (seconds)
_CHECKPOINT_GUESS = 0.5


def count_from(t0: float | None) -> None:
    """Start the next training session's clock at ``t0`` (a ``time.perf_counter()`` value).

    ``attnlab`` calls it when the command starts, so that start-up time counts against
    ``--max-time``, and ``count_from(None)`` when it ends; the next :func:`attnlab.train.train`
    in between takes it (once).
    """
    global _started_at
    _started_at = t0


def session_start() -> float:
    """The start of this training session's clock: the time given to :func:`count_from` (taken
    once), or now."""
    global _started_at
    t0, _started_at = _started_at, None
    now = time.perf_counter()
    return now if t0 is None or t0 > now else t0


class Budget:
    """When a timed run must stop so that its final validation and checkpoint fit in it.

    Args:
        max_time: the budget in seconds (``TrainConfig.max_time``).
        warn: log a warning when validation takes more than half the budget (rank 0).
        device: the device of the training (under torchrun rank 0's clock is broadcast on it).
    """

    def __init__(self, max_time: float, *, warn: bool = True, device=None) -> None:
        pyplot()  # a one-off import (the first loss plot's), not what a validation costs
        self.max_time = max_time
        self.device = device
        self.step_time: float | None = None  # running mean of one optimizer step (seconds)
        self.reserve: float | None = None  # the longest validation + checkpoint so far
        self.warn = warn

    @classmethod
    def of(cls, cfg: TrainConfig, device=None, *, warn: bool = True) -> Budget | None:
        """The budget of a timed run (``cfg.max_time``); None for a run counted in steps."""
        return cls(cfg.max_time, warn=warn, device=device) if cfg.timed else None

    def record_step(self, seconds: float) -> None:
        """One optimizer step took ``seconds`` (a running mean smooths the noise)."""
        if self.step_time is None:
            self.step_time = seconds
        else:
            self.step_time = 0.8 * self.step_time + 0.2 * seconds

    def record_final(self, seconds: float) -> None:
        """A validation + checkpoint took ``seconds``: the reserve for the final one is the
        longest so far (a warning, once, if that is more than half the budget)."""
        self.reserve = seconds if self.reserve is None else max(self.reserve, seconds)
        if seconds > 0.5 * self.max_time and self.warn:
            self.warn = False
            log.warning(
                "validation and checkpoint take %.1f s, more than half of max_time=%g s: the "
                "final one overruns the budget; lower eval_batches (--eval-batches)",
                seconds,
                self.max_time,
            )

    def fraction(self, elapsed: float) -> float:
        """Schedule progress after the next step: ``(elapsed + step) / (max_time - reserve)``.

        At 1 or more, the next step would eat into the time the final validation needs: stop.
        """
        guess = min(_CHECKPOINT_GUESS, 0.1 * self.max_time)  # before a validation was timed
        reserve = guess if self.reserve is None else self.reserve
        reserve = min(reserve, 0.5 * self.max_time)  # (beyond that, the final one overruns)
        return (elapsed + (self.step_time or 0.0)) / (self.max_time - reserve)


def schedule_point(
    budget: Budget | None, cfg: TrainConfig, step: int, elapsed: float
) -> tuple[float | None, bool]:
    """``(t, finished)`` before a step: the schedule's progress ``t`` (None for a step-counted
    run) and whether the run has reached its length or budget (then the step is not taken).

    A timed run's ``t`` is :meth:`Budget.fraction`, the same on every rank (rank 0's, broadcast);
    a fresh timed run takes one step at least, even if the start-up used the budget.
    """
    if budget is None:
        return None, step >= cfg.steps
    t = broadcast_float(budget.fraction(elapsed), budget.device)
    return min(t, 1.0), t >= 1.0 and step > 0


def after_step(budget: Budget | None, cfg: TrainConfig, step: int, started: float) -> bool:
    """After optimizer step ``step`` (completed), begun at ``started`` (``perf_counter``): record
    its time (timed run) and say whether a step-counted run has now reached its length (so the
    checkpoint written next says so: :mod:`attnlab.train.stopping`)."""
    if budget is None:
        return step >= cfg.steps
    budget.record_step(time.perf_counter() - started)
    return False
