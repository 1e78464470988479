"""Ctrl-C and SIGTERM during training: a checkpoint of the last whole step, then a clean exit.

A scheduler (Slurm, Kubernetes, a cloud's spot reclaim) stops a job with SIGTERM and, after a
grace period, SIGKILL. :func:`attnlab.train.train` treats SIGTERM like Ctrl-C: it raises
:class:`Terminated` (a ``KeyboardInterrupt``) between steps, the loop saves a checkpoint of the
last completed step, and ``attnlab`` exits with status 143 (Ctrl-C: 130); ``--resume`` then
continues exactly.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["Terminated", "Interrupts"]

log = logging.getLogger(__name__)


class Terminated(KeyboardInterrupt):
    """SIGTERM (what a scheduler sends before it kills a job) arrived while training.

    Handled like Ctrl-C: the last completed step is checkpointed first, then this propagates.
    The command line exits with :attr:`exit_status` 143 (128 + SIGTERM; Ctrl-C gives 130).
    """

    exit_status = 143


class Interrupts:
    """Ctrl-C and SIGTERM while training: raised between steps, never inside a parameter update.

    A signal that arrives inside :meth:`deferred` (the optimizer step) is raised as soon as the
    update is complete, so the checkpoint written on the way out always holds whole steps. A
    second SIGTERM while that checkpoint is written is ignored (the scheduler's SIGKILL is the
    hard stop); a second Ctrl-C aborts the save. Handlers are installed only in the main thread
    and only in place of Python's defaults (a caller's own handler is left alone), and restored
    on exit.
    """

    def __init__(self) -> None:
        self.previous: dict[int, Any] = {}
        self.in_update = False
        self.pending: KeyboardInterrupt | None = None
        self.stopping = False

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
            for signum, default in defaults.items():
                if signal.getsignal(signum) is default:
                    self.previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGTERM and self.stopping:
            log.warning("SIGTERM again: still saving the checkpoint")
            return
        err = (
            Terminated("terminated (SIGTERM)") if signum == signal.SIGTERM else KeyboardInterrupt()
        )
        if self.in_update:
            self.pending = self.pending or err
            return
        self.stopping = True
        raise err

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Hold Ctrl-C / SIGTERM back until the block (one parameter update) is done."""
        self.in_update = True
        try:
            yield
        finally:
            self.in_update = False
        if self.pending is not None:
            err, self.pending = self.pending, None
            self.stopping = True
            raise err
