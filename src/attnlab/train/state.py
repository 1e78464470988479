"""The training loop's state as named, typed values: what a :func:`attnlab.train.train` call set
up (:class:`Session`), what the loop changes and checkpoints (:class:`TrainState`, with
:class:`~attnlab.train.checkpoint.Progress`), and the results of one step on their way to the
metrics log (:class:`StepOutput`, :class:`PendingStep`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from attnlab.config.train import TrainConfig
from attnlab.tasks.base import Task
from attnlab.train.checkpoint import Progress
from attnlab.train.distributed import DistInfo
from attnlab.train.optim import LRSchedule
from attnlab.train.signals import Interrupts

__all__ = ["StepOutput", "PendingStep", "Session", "TrainState"]


class StepOutput(NamedTuple):
    """What one optimizer step's forward and backward passes give (kept on the device)."""

    loss: Tensor  # mean loss over the global batch, a 0-d tensor
    grad_norm: Tensor | None  # the global gradient norm before clipping (None: no clipping)
    metrics: dict[str, Any]  # the task's extra metrics, averaged like the loss
    count: int  # units (tokens, examples) of this rank's share of the batch


class PendingStep(NamedTuple):
    """A finished step waiting for the next metrics line (one device -> host copy per window)."""

    step: int  # optimizer steps completed with this one
    lr: float  # the learning rate it used
    loss: Tensor
    grad_norm: Tensor | None
    metrics: dict[str, Any]
    count: int


@dataclass(frozen=True)
class Session:
    """What one :func:`train` call set up, fixed while its loop runs."""

    model: nn.Module
    task: Task
    cfg: TrainConfig
    run_dir: Path
    info: DistInfo  # rank, world, device
    micro_bs: int  # examples per micro-batch on this rank
    started: float  # the session clock's start (clock.py)
    interrupts: Interrupts  # the installed SIGINT/SIGTERM handling
    stop_after: int | None = None  # end the session once this many steps are done in total


@dataclass
class TrainState:
    """What the loop changes and a checkpoint saves (besides the weights and the RNG)."""

    optimizer: torch.optim.Optimizer
    schedule: LRSchedule
    prog: Progress
    history: list[dict]
