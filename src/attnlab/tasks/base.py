"""The ``Task`` protocol: what a model family gives the shared trainer, and ``to_device``.

A task owns the data and the loss; the trainer owns the loop. Batches must depend only on
``(task seed, split, step)`` so that a resumed run sees exactly the batches an uninterrupted one
would, and so that data-parallel ranks can each build their share of the same global batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

__all__ = ["Task", "to_device"]


@runtime_checkable
class Task(Protocol):
    """What each model family provides to :func:`attnlab.train.train`.

    Optional: ``evaluate(model) -> dict[str, float]``, extra metrics computed on rank 0 at each
    validation (e.g. BLEU, accuracy on a probe set); they are logged next to ``val_loss``.
    """

    def get_batch(
        self, split: str, step: int, batch_size: int, rank: int = 0, world: int = 1
    ) -> Any:
        """This rank's share of the global batch number ``step`` of ``split``.

        Deterministic in (task seed, split, step). The trainer asks for
        ``batch_size = cfg.batch_size // cfg.grad_accum`` examples per micro-step, with
        ``step = optimizer_step * grad_accum + micro_step``; each rank gets
        ``batch_size // world`` of them. Tensors stay on the CPU; the trainer moves them.
        """

    def loss(self, model: nn.Module, batch: Any, cfg: Any) -> tuple[Tensor, dict[str, float]]:
        """Mean loss over the batch (a scalar tensor) and extra metrics such as ``{"acc": ...}``.

        ``model`` may be wrapped (DDP, ``torch.compile``); attributes of the underlying module
        are still reachable on it.
        """

    def eval_batches(self, batch_size: int, n_batches: int) -> Iterable[Any]:
        """A fixed validation set: the same batches every time it is called."""

    def count(self, batch: Any) -> int:
        """Tokens (or examples) in ``batch``, for the tokens/s figure."""

    def config_dict(self) -> dict:
        """Stored as ``"task"`` in config.json."""

    def save_artifacts(self, run_dir: Path) -> None:
        """Write the tokenizer / vocabulary / label names into ``run_dir`` (rank 0 only)."""


def to_device(obj: Any, device: torch.device | str) -> Any:
    """Move every tensor inside ``obj`` (tensor, dict, list, tuple, namedtuple, dataclass)."""
    if isinstance(obj, Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, dict):
        return type(obj)((k, to_device(v, device)) for k, v in obj.items())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(to_device(v, device) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(v, device) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(
            obj,
            **{
                f.name: to_device(getattr(obj, f.name), device)
                for f in dataclasses.fields(obj)
                if f.init
            },
        )
    return obj
