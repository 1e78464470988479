"""What every ``attnlab experiment`` of the lecture's claims shares.

- :class:`Budget`: the wall-clock seconds of the *whole* experiment (``--max-time``), handed out
  run by run as equal shares of what is left, each run a time-limited training run (so the
  budget holds on a loaded machine); :func:`seconds_per_step` measures a configuration's speed so
  that an experiment can size what depends on a run's length (a warm-up, a schedule) before it
  starts. With ``steps`` instead, every run trains for exactly that many steps (repeatable).
- :func:`prepare_out_dir`: an experiment never writes into a directory that holds anything unless
  told to overwrite it.
- :class:`Table` and :func:`write_outputs`: the results as ``table.md`` (Markdown), ``results.json``
  and a plot, next to each other in the output directory.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.errors import RunDirError, UserError
from attnlab.fileio import atomic_write_text
from attnlab.tasks import to_device
from attnlab.train.distributed import resolve_device
from attnlab.train.optim import make_optimizer

__all__ = [
    "Budget",
    "seconds_per_step",
    "steps_within",
    "warmup_within",
    "prepare_out_dir",
    "at_most",
    "Table",
    "write_outputs",
    "undertrained",
    "check_bounds",
    "TABLE_FILE",
    "RESULTS_FILE",
]

TABLE_FILE = "table.md"
RESULTS_FILE = "results.json"


class Budget:
    """A wall-clock budget for a whole experiment, started when created.

    Args:
        seconds: the total (``--max-time``); must be positive.
        clock: a monotonic clock (tests pass a fake one).

    Raises:
        UserError: ``seconds`` is not positive.
    """

    def __init__(self, seconds: float, *, clock: Callable[[], float] = time.perf_counter) -> None:
        if not seconds > 0:
            raise UserError(f"--max-time must be a positive number of seconds, got {seconds}")
        self.seconds = float(seconds)
        self._clock = clock
        self._start = clock()

    def elapsed(self) -> float:
        """Seconds since the experiment started."""
        return self._clock() - self._start

    def remaining(self) -> float:
        """Seconds left (never negative)."""
        return max(0.0, self.seconds - self.elapsed())

    def share(self, parts: float, *, reserve: float = 0.0) -> float:
        """One of ``parts`` equal shares of what remains after keeping ``reserve`` seconds back
        (for evaluation and plots)."""
        if parts <= 0:
            raise ValueError(f"parts must be positive, got {parts}")
        return max(0.0, self.remaining() - reserve) / parts


def steps_within(seconds: float, seconds_per_step: float, *, minimum: int = 1) -> int:
    """How many steps of ``seconds_per_step`` fit in ``seconds`` (at least ``minimum``)."""
    if seconds_per_step <= 0:
        return max(minimum, 1)
    return max(minimum, math.floor(seconds / seconds_per_step))


def warmup_within(steps: int, usual: int) -> int:
    """A warm-up of ``usual`` steps, shortened to a fifth of a short run (at least 1)."""
    return max(1, min(usual, steps // 5))


def seconds_per_step(
    model: nn.Module,
    task: Any,
    train_cfg: Any,
    *,
    steps: int = 10,
    warmup: int = 3,
) -> float:
    """Wall-clock seconds of one optimizer step of ``task`` on a copy of ``model``.

    Runs ``warmup`` untimed then ``steps`` timed steps of the training loop's work (batch, forward,
    backward, AdamW update) on a copy, without the run-directory bookkeeping of
    :func:`attnlab.train.train`, whose fixed costs would swamp a few steps; ``model`` itself is
    untouched.

    Args:
        model: the model to time (copied).
        task: its :class:`attnlab.tasks.Task`.
        train_cfg: the :class:`attnlab.train.TrainConfig` of the real run (batch size,
            accumulation, device).
    """
    device = resolve_device(train_cfg.device)
    probe = copy.deepcopy(model).to(device).train()
    optimizer = make_optimizer(probe, train_cfg, device)
    micro = train_cfg.batch_size // train_cfg.grad_accum
    start = time.perf_counter()
    for step in range(warmup + steps):
        if step == warmup:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
        for m in range(train_cfg.grad_accum):
            batch = to_device(
                task.get_batch("train", step * train_cfg.grad_accum + m, micro), device
            )
            loss, _ = task.loss(probe, batch, train_cfg)
            (loss / train_cfg.grad_accum).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return max(time.perf_counter() - start, 1e-9) / steps


def at_most(config: Any, **limits: int) -> None:
    """Refuse a setting above its limit (sizes a 2-core machine could never build or run).

    Raises:
        UserError: ``NAME=VALUE is more than this experiment allows (at most LIMIT)``.
    """
    for name, limit in limits.items():
        value = getattr(config, name)
        if value is not None and value > limit:
            raise UserError(f"{name}={value} is more than this experiment allows (at most {limit})")


def prepare_out_dir(out: str | Path, *, overwrite: bool = False) -> Path:
    """Create the experiment's output directory; refuse one that holds anything.

    Raises:
        RunDirError: ``out`` is a file, or a non-empty directory and ``overwrite`` is not set.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise RunDirError(f"{out} is a file; give --out a directory")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise RunDirError(
                f"{out} already holds files; choose another --out or pass --overwrite "
                "to replace them"
            )
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def _cell(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and fmt:
        return format(value, fmt)
    return str(value)


@dataclass
class Table:
    """A results table: column names, rows of values, one number format per column.

    Attributes:
        columns: header labels.
        rows: one list of values per row (numbers, strings or None for "–").
        formats: format spec per column (``".3f"``, ``".1%"``...; ``""`` = ``str``).
    """

    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    formats: list[str] | None = None

    def add(self, *values: Any) -> None:
        """Append a row.

        Raises:
            ValueError: the row does not have one value per column.
        """
        if len(values) != len(self.columns):
            raise ValueError(f"row has {len(values)} values for {len(self.columns)} columns")
        self.rows.append(list(values))

    def markdown(self) -> str:
        """The table in Markdown (numbers right-aligned)."""
        fmts = self.formats or [""] * len(self.columns)
        cells = [[_cell(v, f) for v, f in zip(row, fmts)] for row in self.rows]
        numeric = [
            all(isinstance(r[i], (int, float)) or r[i] is None for r in self.rows)
            for i in range(len(self.columns))
        ]
        head = "| " + " | ".join(self.columns) + " |"
        sep = "|" + "|".join("---:" if n else "---" for n in numeric) + "|"
        body = ["| " + " | ".join(r) + " |" for r in cells]
        return "\n".join([head, sep, *body])

    def to_dict(self) -> dict:
        """``{"columns": [...], "rows": [{column: value}, ...]}`` (for results.json)."""
        return {"columns": self.columns, "rows": [dict(zip(self.columns, r)) for r in self.rows]}


def write_outputs(
    out: Path,
    title: str,
    tables: Sequence[Table],
    results: dict,
    notes: str = "",
    plot: tuple[Callable[[dict, Path], Any], str] | None = None,
    *,
    budget: Budget | None = None,
) -> dict[str, Path]:
    """Write ``table.md``, ``results.json`` and the plot into ``out``.

    Args:
        out: the (prepared) output directory.
        title: the Markdown heading.
        tables: the tables, in order (``results.json`` holds them under ``"tables"``).
        results: everything else worth keeping (settings, per-run numbers); JSON-serialisable.
        notes: Markdown after the tables (the budget, a one-line reading of the numbers).
        plot: ``(draw, file name)``: ``draw(results, path)`` draws the figure.
        budget: the experiment's :class:`Budget`: its elapsed seconds go into ``results`` as
            ``"elapsed"`` and end the notes ("Whole experiment N s."), followed by
            ``results["summary"]`` (the one-paragraph reading) where there is one.

    Returns:
        ``{"table": path, "results": path, "plot": path}`` (no ``plot`` without a plotter).
    """
    if budget is not None:
        results["elapsed"] = budget.elapsed()
        notes = f"{notes.strip()} Whole experiment {results['elapsed']:.0f} s.".strip()
        if results.get("summary"):
            notes += "\n\n" + results["summary"]
    text = f"# {title}\n\n" + "\n\n".join(t.markdown() for t in tables)
    if notes:
        text += "\n\n" + notes.strip()
    atomic_write_text(out / TABLE_FILE, text + "\n")
    payload = {**results, "tables": [t.to_dict() for t in tables]}
    atomic_write_text(out / RESULTS_FILE, json.dumps(payload, indent=2) + "\n")
    written = {"table": out / TABLE_FILE, "results": out / RESULTS_FILE}
    if plot is not None:
        draw, name = plot
        draw(results, out / name)
        written["plot"] = out / name
    return written


def undertrained(
    scores: Mapping[str, float | None],
    *,
    threshold: float,
    what: str,
    higher_is_better: bool = True,
    max_time: float | None = None,
    steps: int | None = None,
    budget: Mapping[str, Any] | None = None,
    fmt: Callable[[float], str] = lambda v: f"{v:.3g}",
) -> str | None:
    """The paragraph that replaces an experiment's conclusion when its runs trained too little.

    A comparison between conditions means something only once every run has learnt the task
    where it is easiest (the shortest sources, the most images...): a model at chance there
    loses everywhere for want of training, not for the reason the experiment tests.

    Args:
        scores: run name -> its score on the easiest condition (None: not measured).
        threshold: the score every run must pass (stated in the message).
        what: the score in words (``"exact match on 1-4-word sources"``).
        higher_is_better: accuracy-like (True) or loss-like (False).
        max_time: the budget used (seconds), to suggest a longer one; or ``steps``.
        budget: the run's recorded config instead: its ``steps`` when it has them, else its
            ``max_time``.
        fmt: how a score is written.

    Returns:
        ``"Undertrained: ... no conclusion is drawn; train longer (--max-time N)."``, or None
        when every run passed the threshold.
    """
    if budget is not None:
        steps = budget.get("steps")
        max_time = None if steps else budget.get("max_time")
    short = {
        k: v
        for k, v in scores.items()
        if v is None or (v < threshold if higher_is_better else v > threshold)
    }
    if not short:
        return None
    worst = [v for v in short.values() if v is not None]
    if worst and all(v > 0 for v in worst) and not higher_is_better:
        gap = max(worst) / threshold
    elif worst and higher_is_better:
        gap = threshold / max(min(worst), threshold / 8)
    else:
        gap = 4.0
    factor = min(8.0, max(2.0, 2.0 * gap))
    if max_time is not None:
        longer = f"--max-time {int(math.ceil(max_time * factor / 10) * 10)}"
    elif steps is not None:
        longer = f"--steps {int(math.ceil(steps * factor / 100) * 100)}"
    else:
        longer = "a longer budget"
    got = ", ".join(f"{k} {'n/a' if v is None else fmt(v)}" for k, v in short.items())
    need = "at least" if higher_is_better else "at most"
    return (
        f"Undertrained: {what} is {got}, where every run needs {need} {fmt(threshold)} before "
        "the comparison says anything about the claim; no conclusion is drawn from this run. "
        f"Train longer ({longer})."
    )


def check_bounds(cfg: Any, bounds: Mapping[str, tuple[float, float]]) -> None:
    """Refuse a setting outside its range before anything is built.

    Args:
        cfg: the experiment's settings (a dataclass).
        bounds: field name -> ``(lowest, highest)`` allowed, inclusive; a ``None`` value is
            left alone, a tuple of numbers (``layers``) is checked element by element.

    Raises:
        UserError: naming the flag, its value and the range (NaN and infinities included).
    """
    for name, (lo, hi) in bounds.items():
        value = getattr(cfg, name)
        if value is None:
            continue
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and lo <= v <= hi):
                flag = "--" + name.replace("_", "-")
                raise UserError(f"{flag} must be between {lo:g} and {hi:g}, got {v!r}")


def percent(v: float) -> str:
    """A fraction written as a percentage with one decimal (``0.123`` -> ``12.3 %``)."""
    return f"{100 * v:.1f} %"
