"""What the language-model experiments share (``extrapolation``, ``norm-placement``, ``warmup``).

- :func:`lm_task`: next-token prediction on a built-in corpus (character-level ``pydoc`` by
  default), prepared once into the cache;
- :func:`lm_model`: a :class:`attnlab.models.lm.DecoderLM` from a preset with overrides;
- :func:`train_run`: one :func:`attnlab.train.train` run that reports divergence instead of
  raising it: a non-finite loss (it stops the run: :class:`attnlab.train.TrainingDiverged`), a
  loss that blew up — rose more than :data:`BLOWUP_MARGIN` nats above the first step's, even if
  it came back down later — or a loss that ended no lower than it started;
- :func:`layer_grad_norms`: the gradient norm of each block's parameters at one batch.

Shape legend: B batch, T window length, V vocab_size, L layers.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.config.base import Config
from attnlab.config.lm import LMTaskConfig, ModelConfig
from attnlab.experiments.common import undertrained
from attnlab.models.lm import DecoderLM
from attnlab.tasks.lm import LMTask
from attnlab.train import TrainingDiverged, train
from attnlab.train.checkpoint import METRICS_FILE

__all__ = [
    "lm_results",
    "LMExperimentConfig",
    "lm_task",
    "lm_model",
    "train_run",
    "layer_grad_norms",
    "BLOWUP_MARGIN",
    "DIVERGED_MEANS",
    "LEARNT_BELOW_UNIFORM",
    "undertrained_lm",
]

#: the best run's final loss must sit this many nats under ln V (a uniform guess over the
#: characters) before divergence counts are read: every run still near its starting loss says
#: nothing of what warm-up or norm placement do to training (the documented runs reach 2.9-3.3 on
#: pydoc, ln V = 4.6; a few steps stay at about 4.5)
LEARNT_BELOW_UNIFORM = 1.0

#: a run whose loss rises this many nats above the first step's loss has blown up
BLOWUP_MARGIN = 1.0

#: what "diverged" means in the tables
DIVERGED_MEANS = (
    "a non-finite loss, a loss that blew up (rose more than 1 nat above the first step's, even "
    "if it came back down), or a final loss (mean of the last tenth of the steps) no lower than "
    "the first step's"
)


@dataclass
class LMExperimentConfig(Config):
    """The settings every LM experiment shares (each experiment's config adds its own).

    Args:
        max_time: seconds for the whole experiment.
        steps: train every run for exactly this many steps instead (repeatable).
        preset, d_model: the ``DecoderLM`` preset, its width replaced unless None.
        context, batch_size: the training windows (characters) and windows per step.
        data, max_chars: the corpus, read by characters.
        reserve: share of ``max_time`` kept for evaluation, tables and the plot.
        device, seed, progress: as for training.
    """

    max_time: float = 240.0
    steps: int | None = None
    preset: str = "tiny"
    d_model: int | None = None
    context: int = 32
    batch_size: int = 16
    data: str = "pydoc"
    max_chars: int | None = None
    reserve: float = 0.1
    device: str = "auto"
    seed: int = 0
    progress: bool = True


def lm_task(data: str, seq_len: int, *, max_chars: int | None = None, seed: int = 0) -> Any:
    """The :class:`attnlab.tasks.lm.LMTask` of character-level ``data`` with windows of ``seq_len``.

    Raises:
        UserError: an unknown corpus or one too short for ``seq_len``.
    """
    cfg = LMTaskConfig(data=data, tokenizer="char", seq_len=seq_len, max_chars=max_chars, seed=seed)
    return LMTask.build(cfg)


def lm_model(preset: str, vocab_size: int, *, seed: int, **overrides: Any) -> nn.Module:
    """A :class:`DecoderLM` from ``preset`` with ``overrides`` (None values ignored), initialised
    under ``seed``.

    Raises:
        ConfigError: an unknown preset or a bad override.
    """
    overrides = {k: v for k, v in overrides.items() if v is not None}
    cfg = ModelConfig.preset(preset, vocab_size=vocab_size, dropout=0.0, **overrides)
    torch.manual_seed(seed)
    return DecoderLM(cfg)


def undertrained_lm(results: dict, best: float | None, what: str) -> str | None:
    """:func:`attnlab.experiments.common.undertrained` for a language-model experiment: ``best``
    (the lowest final loss of any run; None: every run diverged) against
    ln V − :data:`LEARNT_BELOW_UNIFORM`.

    Args:
        results: the experiment's results (``config`` with ``max_time``/``steps``, ``data`` with
            ``vocab_size``).
        best: the lowest final training loss (nats per character).
        what: the score in words.

    Returns:
        The "Undertrained … Train longer" paragraph, or None.
    """
    cfg = results.get("config") or {}
    uniform = math.log(results["data"]["vocab_size"])
    return undertrained(
        {"best run": best},
        threshold=uniform - LEARNT_BELOW_UNIFORM,
        what=f"{what} (nats per character; ln V = {uniform:.2f})",
        higher_is_better=False,
        budget=cfg,
        fmt=lambda v: f"{v:.2f}",
    )


def lm_results(cfg: Any, task: Any, *, data: dict | None = None, **parts: Any) -> dict:
    """The start of a language-model experiment's ``results.json``: its settings, the corpus
    (name, vocabulary, token counts, plus ``data``) and ``parts`` (steps, runs...)."""
    corpus = {"corpus": cfg.data, "vocab_size": task.vocab_size, "n_tokens": task.n_tokens}
    return {"config": asdict(cfg), "data": {**corpus, **(data or {})}, **parts}


def _read_history(run_dir: Path) -> list[dict]:
    path = run_dir / METRICS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def train_run(model: nn.Module, task: Any, train_cfg: Any, run_dir: Path) -> dict:
    """Train ``model`` and describe how it went, a diverged run included.

    Training records must be written every step (``log_every=1``) for ``initial_loss`` to be the
    first step's loss.

    Returns:
        ``{"steps", "seconds", "losses": [per logged step], "initial_loss", "final_loss" (mean of
        the last tenth of the logged losses; NaN when training stopped), "max_loss", "diverged"
        (bool), "diverged_at" (the step whose loss was non-finite, else None), "how"
        ("non-finite loss", "loss blew up", "no progress" or "")}``.
    """
    diverged_at = None
    try:
        res = train(model, task, train_cfg, run_dir)
        history, steps, seconds = res.history, res.steps, res.elapsed
    except TrainingDiverged:
        history = _read_history(run_dir)
        steps = (max((r["step"] for r in history if "loss" in r), default=0)) + 1
        diverged_at, seconds = steps, (history[-1].get("elapsed", 0.0) if history else 0.0)
    losses = [r["loss"] for r in history if "loss" in r]
    initial = losses[0] if losses else float("nan")
    tail = losses[-max(1, len(losses) // 10) :] if losses else [float("nan")]
    final = statistics.fmean(tail)
    peak = max(losses) if losses else float("nan")
    if diverged_at is not None:
        how = "non-finite loss"
    elif peak > initial + BLOWUP_MARGIN:
        how = "loss blew up"
    elif final >= initial:
        how = "no progress"
    else:
        how = ""
    return {
        "steps": steps,
        "seconds": seconds,
        "losses": losses,
        "initial_loss": initial,
        "final_loss": final if diverged_at is None else float("nan"),
        "max_loss": peak,
        "diverged": bool(how),
        "diverged_at": diverged_at,
        "how": how,
    }


def layer_grad_norms(model: nn.Module, task: Any, batch: Any) -> list[float]:
    """The L2 norm of the gradient of each block's parameters, one batch, at the current weights.

    The model's gradients are cleared afterwards; its weights are untouched.
    """
    model.zero_grad(set_to_none=True)
    loss, _ = task.loss(model, batch)
    loss.backward()
    norms = []
    for block in model.blocks:
        sq = sum(float(p.grad.pow(2).sum()) for p in block.parameters() if p.grad is not None)
        norms.append(math.sqrt(sq))
    model.zero_grad(set_to_none=True)
    return norms
