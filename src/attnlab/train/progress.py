"""The training progress bar (tqdm on stderr, rank 0 only): steps, or seconds of a time budget."""

from __future__ import annotations

import sys
from typing import Any

from tqdm.auto import tqdm

from attnlab.train.checkpoint import Progress
from attnlab.train.config import TrainConfig

__all__ = ["open_bar"]


def open_bar(cfg: TrainConfig, prog: Progress) -> Any:
    """A tqdm bar over ``cfg.steps`` (or the seconds of ``cfg.max_time``), starting at ``prog``.

    Redirected to a file or a CI log, it writes a line every 30 s instead of redrawing per step.
    """
    quiet = {} if sys.stderr.isatty() else {"mininterval": 30.0}
    if cfg.timed:
        return tqdm(
            **quiet,
            total=round(cfg.max_time),
            initial=min(round(prog.elapsed), round(cfg.max_time)),
            unit="s",
            desc="train",
            dynamic_ncols=True,
            bar_format="{l_bar}{bar}| {n:.0f}/{total_fmt}s [{elapsed}<{remaining}{postfix}]",
        )
    return tqdm(
        **quiet, total=cfg.steps, initial=prog.step, unit="step", desc="train", dynamic_ncols=True
    )
