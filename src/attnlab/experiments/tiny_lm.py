"""What the tiny-LM experiments on the CPU share (:mod:`~attnlab.experiments.induction`,
:mod:`~attnlab.experiments.ablations`): the budget, the optimiser's batch, the model's heads and
positions, the corpus read, and the ranges their settings are checked against.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.config.base import Config

__all__ = ["BOUNDS", "TinyLMSettings"]

#: the ranges every tiny-LM experiment checks (a CPU experiment: larger values are mistakes,
#: refused before building); each experiment adds its own fields' ranges
BOUNDS = {
    "max_time": (1e-3, 1e7), "steps": (1, 10**7), "d_model": (2, 4096), "n_heads": (1, 256),
    "batch_size": (1, 4096), "lr": (1e-12, 10.0), "max_chars": (1, 10**9),
}  # fmt: skip


@dataclass
class TinyLMSettings(Config):
    """The settings every tiny-LM experiment has (a :class:`~attnlab.config.Config`: typed,
    ``to_dict``/``from_dict``, unknown fields refused).

    Args:
        max_time: seconds for the whole experiment (the runs share it equally).
        steps: train every run for exactly this many steps instead.
        n_heads: heads per layer.
        batch_size: sequences per AdamW step.
        position: the position scheme (``rope``, ``learned``, ``alibi``).
        max_chars: characters of pydoc read (None: all).
        seed, progress: as for training.
    """

    max_time: float = 300.0
    steps: int | None = None
    n_heads: int = 4
    batch_size: int = 32
    position: str = "rope"
    max_chars: int | None = None
    seed: int = 0
    progress: bool = True
