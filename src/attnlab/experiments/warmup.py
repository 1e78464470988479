"""Learning-rate warm-up, measured: Adam with and without a linear warm-up across peak rates.

The claim (the lecture's training-practice section; Vaswani et al. 2017, Liu et al. 2020): early
in training the weights are random and Adam's second-moment estimates rest on a few gradients, so
a large rate from the first step can wreck the model (the loss blows up, or becomes NaN); a
linear warm-up from 0 to the peak rate lets it settle first, so higher peak rates become usable.
For every peak rate and seed, the same ``DecoderLM`` (the seed's initial weights and batches)
trains without and with a warm-up (constant rate afterwards, no gradient clipping) for the same
number of steps (sized from the ``max_time`` budget, or ``steps``) on character-level ``pydoc``.
Measured per setting: how many seeds diverged (a non-finite loss, a loss that blew up — rose more
than 1 nat above the first step's, even if it came back down — or a final loss no lower than the
first step's), and the final training loss (mean of the last tenth of the steps).

Outputs: ``table.md``, ``results.json``, ``warmup.png`` and ``runs/lr<rate>-warmup<w>-seed<s>``.
"""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from attnlab.errors import UserError
from attnlab.experiments import common
from attnlab.experiments.lm_runs import (
    DIVERGED_MEANS,
    LMExperimentConfig,
    lm_model,
    lm_results,
    lm_task,
    train_run,
    undertrained_lm,
)
from attnlab.experiments.training import train_settings
from attnlab.plotting import pyplot, save_png

__all__ = ["WarmupConfig", "run_warmup"]

log = logging.getLogger(__name__)


@dataclass
class WarmupConfig(LMExperimentConfig):
    """Settings of the warm-up experiment (and :class:`LMExperimentConfig`'s).

    Args:
        lrs: the peak learning rates compared.
        seeds: seeds per setting (0, 1, … added to ``seed``).
        warmup_frac: the warm-up of the warmed-up runs, as a fraction of the run.
        n_layers, norm_position: the model's depth and norm placement.
    """

    lrs: tuple[float, ...] = (1e-2, 3e-2, 1e-1, 3e-1)
    seeds: int = 3
    warmup_frac: float = 0.2
    n_layers: int = 4
    norm_position: str = "post"


def run_warmup(cfg: WarmupConfig, out_dir: str | Path, *, overwrite: bool = False) -> dict:
    """Train every (peak rate, warm-up, seed) and count divergences.

    Returns:
        ``{"config", "data", "steps", "warmup_steps", "runs": [{"lr", "warmup_steps", "seed",
        "steps", "seconds", "diverged", "how", "initial_loss", "final_loss", "max_loss",
        "losses"}], "settings": [{"lr", "warmup_steps", "diverged", "of", "final_loss",
        "final_losses"}], "summary", "elapsed"}``.

    Raises:
        RunDirError: ``out_dir`` holds files and ``overwrite`` is not set.
        UserError: a bad setting.
    """
    if not cfg.lrs or not all(lr > 0 for lr in cfg.lrs):
        raise UserError(f"peak learning rates must be positive, got {cfg.lrs}")
    if cfg.seeds < 1:
        raise UserError(f"--seeds must be at least 1, got {cfg.seeds}")
    if not 0.0 < cfg.warmup_frac < 1.0:
        raise UserError(f"the warm-up fraction must lie in (0, 1), got {cfg.warmup_frac}")
    if cfg.norm_position not in ("post", "pre"):
        raise UserError(f"norm placement must be post or pre, got {cfg.norm_position!r}")
    budget = common.Budget(cfg.max_time)
    out = common.prepare_out_dir(out_dir, overwrite=overwrite)
    task = lm_task(cfg.data, cfg.context, max_chars=cfg.max_chars, seed=cfg.seed)
    seeds = [cfg.seed + i for i in range(cfg.seeds)]

    def build(seed: int):
        return lm_model(
            cfg.preset,
            task.vocab_size,
            seed=seed,
            max_seq_len=cfg.context,
            n_layers=cfg.n_layers,
            norm_position=cfg.norm_position,
            d_model=cfg.d_model,
        )

    tcfg = train_settings(  # (each run sets its own seed)
        cfg,
        steps=cfg.steps or 1,
        lr=max(cfg.lrs),
        schedule="constant",
        warmup_steps=0,
        grad_clip=None,  # clipping would hide the instability measured here
        eval_batches=0,
        log_every=1,
    )
    n_runs = len(cfg.lrs) * 2 * len(seeds)
    if cfg.steps is None:
        per_step = common.seconds_per_step(build(cfg.seed), task, tcfg, steps=5, warmup=2)
        left = budget.remaining() - cfg.reserve * cfg.max_time
        steps = common.steps_within(left / n_runs, per_step, minimum=10)
        log.info("warmup: %d steps per run (%.3f s/step)", steps, per_step)
    else:
        steps = cfg.steps
    warm = max(2, round(cfg.warmup_frac * steps))  # 1 step of warm-up is none

    runs = []
    for lr in cfg.lrs:
        for w in (0, warm):
            for seed in seeds:
                run_cfg = tcfg.replace(steps=steps, lr=lr, warmup_steps=w, seed=seed)
                res = train_run(
                    build(seed), task, run_cfg, out / "runs" / f"lr{lr:g}-warmup{w}-seed{seed}"
                )
                runs.append({"lr": lr, "warmup_steps": w, "seed": seed, **res})
    settings = []
    for lr in cfg.lrs:
        for w in (0, warm):
            rs = [r for r in runs if r["lr"] == lr and r["warmup_steps"] == w]
            finite = [r["final_loss"] for r in rs if math.isfinite(r["final_loss"])]
            settings.append(
                {
                    "lr": lr,
                    "warmup_steps": w,
                    "diverged": sum(r["diverged"] for r in rs),
                    "of": len(rs),
                    "final_loss": statistics.fmean(finite) if finite else None,
                    "final_losses": finite,
                }
            )
    results = lm_results(cfg, task, steps=steps, warmup_steps=warm, runs=runs, settings=settings)
    results["summary"] = summarise(results)
    table = common.Table(
        ["peak lr", "warm-up steps", "diverged", "final loss (mean)", "final loss per seed"],
        formats=["g", "d", "", ".3f", ""],
    )
    for s in settings:
        table.add(
            s["lr"],
            s["warmup_steps"],
            f"{s['diverged']}/{s['of']}",
            s["final_loss"],
            ", ".join(f"{v:.2f}" for v in s["final_losses"]) or "–",
        )
    notes = (
        f"`{cfg.preset}` DecoderLM, {cfg.n_layers} layers, {cfg.norm_position}-norm; windows of "
        f"{cfg.context} characters of `{cfg.data}`, batch {cfg.batch_size}; AdamW (betas 0.9, "
        f"0.95), constant rate after the warm-up, no gradient clipping; {steps} steps per run, "
        f"seeds {seeds[0]}…{seeds[-1]}. Diverged = {DIVERGED_MEANS}. Final loss: mean of the "
        "last tenth of the steps."
    )
    title = "Warm-up: divergence and loss across peak learning rates"
    common.write_outputs(
        out, title, [table], results, notes, plot=(plot_warmup, "warmup.png"), budget=budget
    )
    return results


def summarise(results: dict) -> str:
    """Divergences without and with warm-up, and the best setting; or, when no setting got
    clearly under ln V, the divergence counts and "Undertrained … train longer"."""
    by = {0: [], 1: []}
    for s in results["settings"]:
        by[int(s["warmup_steps"] > 0)].append(s)
    parts = []
    for w, name in ((0, "without warm-up"), (1, "with warm-up")):
        div = sum(s["diverged"] for s in by[w])
        total = sum(s["of"] for s in by[w])
        parts.append(f"{name}: {div}/{total} runs diverged")
    done = [s for s in results["settings"] if s["final_loss"] is not None]
    text = "; ".join(parts) + "."
    best_loss = min((s["final_loss"] for s in done), default=None)
    short = undertrained_lm(results, best_loss, "the lowest mean final loss")
    if short is not None:  # divergence counts of runs that learnt nothing are no evidence
        return text + " " + short
    if done:
        best = min(done, key=lambda s: s["final_loss"])
        text += (
            f" Lowest mean final loss {best['final_loss']:.3f} at peak lr {best['lr']:g} "
            f"{'with' if best['warmup_steps'] else 'without'} warm-up."
        )
    return text


def plot_warmup(results: dict, path: str | Path) -> None:
    """Two panels: final loss by peak rate (every seed, diverged seeds marked); loss curves."""
    plt = pyplot()

    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(13, 4.5))
    warm = results["warmup_steps"]
    for w, colour, name in ((0, "C3", "no warm-up"), (warm, "C0", f"warm-up {warm} steps")):
        rs = [r for r in results["runs"] if r["warmup_steps"] == w]
        ok = [r for r in rs if not r["diverged"]]
        bad = [r for r in rs if r["diverged"] and math.isfinite(r["final_loss"])]
        ax0.scatter(
            [r["lr"] for r in ok],
            [r["final_loss"] for r in ok],
            color=colour,
            label=name,
            alpha=0.7,
        )
        ax0.scatter(
            [r["lr"] for r in bad],
            [r["final_loss"] for r in bad],
            color=colour,
            marker="x",
            s=60,
            label=f"{name}: diverged",
        )
        means = [s for s in results["settings"] if s["warmup_steps"] == w and s["final_loss"]]
        ax0.plot([s["lr"] for s in means], [s["final_loss"] for s in means], color=colour)
        for r in rs:
            ax1.plot(
                r["losses"],
                color=colour,
                alpha=0.35 + 0.4 * (r["lr"] == max(results["config"]["lrs"])),
                linewidth=0.8,
            )
    ax0.set_xscale("log")
    ax0.set_xlabel("peak learning rate")
    ax0.set_ylabel("final training loss (nats/char)")
    ax0.set_title("loss reached, per seed")
    ax0.legend(fontsize=7)
    ax1.set_xlabel("step")
    ax1.set_ylabel("training loss")
    ax1.set_title("every run (red: no warm-up, blue: warm-up)")
    save_png(fig, path)
