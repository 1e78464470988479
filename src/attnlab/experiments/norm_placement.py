"""Post-norm against pre-norm, measured: depth, warm-up, divergence and gradients at initialisation.

The claim (the lecture's section on the Transformer block; Xiong et al. 2020): the original
post-norm block, x ← LN(x + F(x)), trains well at 6 layers but becomes unstable as depth grows and
needs a learning-rate warm-up; the pre-norm block, x ← x + F(LN(x)), keeps an identity path from
the output to every layer and trains deep stacks without one. For every depth, both placements
train the same-sized ``DecoderLM`` (the same seed) at one learning rate, without and with a linear
warm-up, for the same number of steps (sized from the ``max_time`` budget, or ``steps``), on
character-level ``pydoc``. Measured:

- divergence: a non-finite loss (training stops), a loss that blew up (rose more than 1 nat above
  the first step's, even if it came back down), or a loss that ended no lower than it started;
- the final training loss (mean of the last tenth of the steps) and the highest loss seen;
- the gradient norm of each block's parameters at initialisation, on one fixed batch.

Outputs: ``table.md``, ``results.json``, ``norm_placement.png`` and ``runs/<norm>-L<depth>-…``.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass
from pathlib import Path

from attnlab.errors import UserError
from attnlab.experiments import common
from attnlab.experiments.lm_runs import (
    DIVERGED_MEANS,
    LMExperimentConfig,
    layer_grad_norms,
    lm_model,
    lm_results,
    lm_task,
    train_run,
    undertrained_lm,
)
from attnlab.experiments.training import train_settings
from attnlab.plotting import pyplot, save_png

__all__ = ["NormPlacementConfig", "run_norm_placement", "init_grad_norms", "NORMS"]

log = logging.getLogger(__name__)

NORMS = ("post", "pre")


@dataclass
class NormPlacementConfig(LMExperimentConfig):
    """Settings of the norm-placement experiment (and :class:`LMExperimentConfig`'s; the
    preset's depth is replaced by each of ``depths``).

    Args:
        depths: the layer counts compared.
        lr: the one peak learning rate of every run (constant after the warm-up).
        warmup_frac: the warm-up of the warmed-up runs, as a fraction of the run.
    """

    depths: tuple[int, ...] = (2, 6, 12)
    lr: float = 1e-2
    warmup_frac: float = 0.2


def init_grad_norms(
    preset: str, vocab_size: int, task, *, depth: int, norm: str, seed: int, batch_size: int, **kw
) -> list[float]:
    """The gradient norm of each block's parameters of a freshly initialised ``DecoderLM``
    (``seed``), on training batch 0."""
    model = lm_model(preset, vocab_size, seed=seed, n_layers=depth, norm_position=norm, **kw)
    return layer_grad_norms(model, task, task.get_batch("train", 0, batch_size))


def run_norm_placement(
    cfg: NormPlacementConfig, out_dir: str | Path, *, overwrite: bool = False
) -> dict:
    """Train post- and pre-norm LMs per depth, without and with warm-up; measure gradients at init.

    Returns:
        ``{"config", "data", "gradients": [{"depth", "norm", "per_layer"}], "runs": [{"depth",
        "norm", "warmup_steps", "steps", "seconds", "diverged", "how", "diverged_at",
        "initial_loss", "final_loss", "max_loss", "losses"}], "summary", "elapsed"}``.

    Raises:
        RunDirError: ``out_dir`` holds files and ``overwrite`` is not set.
        UserError: a bad setting.
    """
    if not cfg.depths or any(d < 1 for d in cfg.depths):
        raise UserError(f"depths must be positive layer counts, got {cfg.depths}")
    if not 0.0 < cfg.warmup_frac < 1.0:
        raise UserError(f"the warm-up fraction must lie in (0, 1), got {cfg.warmup_frac}")
    budget = common.Budget(cfg.max_time)
    out = common.prepare_out_dir(out_dir, overwrite=overwrite)
    task = lm_task(cfg.data, cfg.context, max_chars=cfg.max_chars, seed=cfg.seed)
    depths = sorted(set(cfg.depths))
    kw = {"max_seq_len": cfg.context, "d_model": cfg.d_model}

    gradients = [
        {
            "depth": d,
            "norm": norm,
            "per_layer": init_grad_norms(
                cfg.preset,
                task.vocab_size,
                task,
                depth=d,
                norm=norm,
                seed=cfg.seed,
                batch_size=cfg.batch_size,
                **kw,
            ),
        }
        for d in depths
        for norm in NORMS
    ]
    tcfg = train_settings(
        cfg,
        steps=cfg.steps or 1,
        lr=cfg.lr,
        schedule="constant",
        warmup_steps=0,
        grad_clip=None,  # clipping would hide the instability measured here
        eval_batches=0,
        log_every=1,
    )
    if cfg.steps is None:  # every run the same steps; a step costs a + b·depth (two probes)
        cost = {}
        for d in {depths[0], depths[-1]}:
            probe = lm_model(cfg.preset, task.vocab_size, seed=cfg.seed, n_layers=d, **kw)
            cost[d] = common.seconds_per_step(probe, task, tcfg)
        lo, hi = depths[0], depths[-1]
        slope = (cost[hi] - cost[lo]) / (hi - lo) if hi > lo else cost[lo] / lo
        slope = max(slope, 0.0)
        per_run_step = sum(cost[lo] + slope * (d - lo) for d in depths) * 2 * len(NORMS)
        left = budget.remaining() - cfg.reserve * cfg.max_time
        steps = common.steps_within(left, per_run_step, minimum=10)
        log.info("norm-placement: %d steps per run", steps)
    else:
        steps = cfg.steps
    warm = max(2, round(cfg.warmup_frac * steps))  # 1 step of warm-up is none

    runs = []
    for d in depths:
        for norm in NORMS:
            for w in (0, warm):
                model = lm_model(
                    cfg.preset, task.vocab_size, seed=cfg.seed, n_layers=d, norm_position=norm, **kw
                )
                run_cfg = tcfg.replace(steps=steps, warmup_steps=w)
                res = train_run(model, task, run_cfg, out / "runs" / f"{norm}-L{d}-warmup{w}")
                runs.append({"depth": d, "norm": norm, "warmup_steps": w, **res})
    results = lm_results(cfg, task, steps=steps, gradients=gradients, runs=runs)
    results["summary"] = summarise(results)
    train_table = common.Table(
        ["depth", "norm", "warm-up steps", "steps", "diverged", "final loss", "highest loss"],
        formats=["d", "", "d", "d", "", ".3f", ".2f"],
    )
    for r in runs:
        verdict = f"yes ({r['how']})" if r["diverged"] else "no"
        train_table.add(
            r["depth"],
            r["norm"],
            r["warmup_steps"],
            r["steps"],
            verdict,
            r["final_loss"],
            r["max_loss"],
        )
    grad_table = common.Table(
        ["depth", "norm", "‖g‖ layer 1", "‖g‖ middle layer", "‖g‖ last layer", "max / min"],
        formats=["d", "", ".4f", ".4f", ".4f", ".1f"],
    )
    for g in gradients:
        v = g["per_layer"]
        grad_table.add(g["depth"], g["norm"], v[0], v[len(v) // 2], v[-1], max(v) / min(v))
    notes = (
        f"`{cfg.preset}` DecoderLM with its depth replaced, windows of {cfg.context} characters "
        f"of `{cfg.data}`, batch {cfg.batch_size}, AdamW at lr {cfg.lr:g} (constant after the "
        f"warm-up), no gradient clipping, {steps} steps per run. Diverged = {DIVERGED_MEANS}. "
        "Gradient norms: each block's parameters, at initialisation, one batch."
    )
    drawn = (plot_norm_placement, "norm_placement.png")
    title = "Post-norm vs pre-norm: depth, warm-up, gradients at initialisation"
    common.write_outputs(
        out, title, [train_table, grad_table], results, notes, plot=drawn, budget=budget
    )
    return results


def summarise(results: dict) -> str:
    """Divergences per placement and warm-up; the spread of gradient norms per placement; and
    "Undertrained … train longer" when no run got clearly under ln V."""
    parts = []
    for norm in NORMS:
        for warm in (False, True):
            rs = [
                r for r in results["runs"] if r["norm"] == norm and (r["warmup_steps"] > 0) == warm
            ]
            if not rs:
                continue
            bad = [str(r["depth"]) for r in rs if r["diverged"]]
            finals = [r["final_loss"] for r in rs if not r["diverged"]]
            parts.append(
                f"{norm}-norm {'with' if warm else 'without'} warm-up: "
                + (f"diverged at depth {', '.join(bad)}" if bad else "no divergence")
                + (f", final loss {min(finals):.3f}–{max(finals):.3f}" if finals else "")
            )
    spread = {
        norm: [
            max(g["per_layer"]) / min(g["per_layer"])
            for g in results["gradients"]
            if g["norm"] == norm
        ]
        for norm in NORMS
    }
    grads = "; ".join(
        f"{n}-norm layer gradient norms differ by up to {max(v):.1f}× (median "
        f"{statistics.median(v):.1f}×)"
        for n, v in spread.items()
        if v
    )
    text = "; ".join(parts) + ". At initialisation: " + grads + "."
    finite = [r["final_loss"] for r in results["runs"] if not r["diverged"]]
    short = undertrained_lm(results, min(finite, default=None), "the lowest final loss")
    return text if short is None else text + " " + short


def plot_norm_placement(results: dict, path: str | Path) -> None:
    """Three panels: gradient norm by layer at init; loss curves without and with warm-up."""
    plt = pyplot()

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    styles = {"post": "-", "pre": "--"}
    depths = sorted({g["depth"] for g in results["gradients"]})
    colours = {d: f"C{i}" for i, d in enumerate(depths)}
    for g in results["gradients"]:
        v = g["per_layer"]
        axes[0].plot(
            range(1, len(v) + 1),
            v,
            styles[g["norm"]],
            color=colours[g["depth"]],
            marker="o",
            markersize=3,
            label=f"{g['norm']}-norm, {g['depth']} layers",
        )
    axes[0].set_yscale("log")
    axes[0].set_xlabel("layer")
    axes[0].set_ylabel("‖gradient‖ of the block's parameters")
    axes[0].set_title("at initialisation")
    axes[0].legend(fontsize=7)
    for ax, warm in zip(axes[1:], (False, True)):
        for r in results["runs"]:
            if (r["warmup_steps"] > 0) != warm:
                continue
            ax.plot(
                r["losses"],
                styles[r["norm"]],
                color=colours[r["depth"]],
                linewidth=1,
                label=f"{r['norm']}-norm, {r['depth']} layers",
            )
        ax.set_xlabel("step")
        ax.set_ylabel("training loss (nats/char)")
        ax.set_title("with warm-up" if warm else "without warm-up")
        ax.legend(fontsize=7)
    save_png(fig, path)
