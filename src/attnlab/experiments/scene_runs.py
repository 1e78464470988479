"""How the scene experiments (vqa-bias, caption-retrieval, caption-features) train each model.

Every model of an experiment gets the same budget and the same trainer settings, so that their
scores differ by architecture only: the experiment's steps (or seconds), batch size and learning
rate, a 50-step warm-up, no weight decay, and one validation at the end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from attnlab.errors import RunDirError

__all__ = ["check_fresh", "train_for_experiment"]


def check_fresh(out: str | Path, names: list[str], overwrite: bool) -> None:
    """Refuse, before any work, to train into runs an earlier experiment left in ``out``.

    Raises:
        RunDirError: ``out/NAME`` holds files for one of ``names`` and ``overwrite`` is false.
    """
    taken = [n for n in names if (Path(out) / n).is_dir() and any((Path(out) / n).iterdir())]
    if taken and not overwrite:
        raise RunDirError(
            f"{str(out)!r} already holds this experiment's runs ({', '.join(taken)}); pass "
            "--overwrite to train them again, or choose another --out"
        )


def train_for_experiment(model: nn.Module, task: Any, cfg: Any, run_dir: str | Path) -> Any:
    """Train ``model`` on ``task`` into ``run_dir`` with the experiment's budget.

    Args:
        model: the model to train (in place).
        task: a :class:`~attnlab.data.scenes.CaptionTask` or :class:`~attnlab.data.scenes.VQATask`.
        cfg: an experiment config with ``steps``, ``max_time``, ``batch_size``, ``lr``, ``seed``,
            ``device``, ``progress`` and ``overwrite``.
        run_dir: where the run is saved (replaced when ``cfg.overwrite``).

    Returns:
        The trainer's ``TrainResult``.
    """
    from attnlab.train import TrainConfig, train

    tcfg = TrainConfig(
        steps=cfg.steps,
        max_time=cfg.max_time,
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        warmup_steps=50,
        weight_decay=0.0,
        eval_every=10**9,  # validate once, at the end
        eval_batches=2,
        seed=cfg.seed,
        device=cfg.device,
        progress=cfg.progress,
    )
    return train(model, task, tcfg, run_dir, overwrite=cfg.overwrite)
