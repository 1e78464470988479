"""Label smoothing, measured: accuracy, NLL and calibration of translation models with ε ∈ {0, 0.1, 0.2}.

The claim (Szegedy et al. 2016; the Transformer paper §5.4; Müller et al. 2019): training towards
``(1 − ε)·onehot + ε/V`` instead of the one-hot target keeps the model from pushing its logits
towards certainty, which hurts perplexity a little but makes its confidence more honest. Every ε
trains the same model from the same initial weights (for ``steps`` steps, or an equal share of
the ``max_time`` budget) on the ``numbers`` task
(200 training pairs, so an unsmoothed model becomes overconfident on held-out data); on the
held-out references, teacher-forced, the experiment measures per token

- accuracy of the argmax, NLL (−log p of the reference token, without smoothing),
- expected calibration error and the reliability diagram (:mod:`attnlab.metrics.calibration`),

and greedy exact match per sentence. Outputs: ``table.md``, ``results.json``,
``reliability.png`` and ``runs/eps-<ε>``.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from attnlab.errors import UserError
from attnlab.experiments import common, training
from attnlab.metrics.calibration import (
    ReliabilityBin,
    confidences,
    expected_calibration_error,
    reliability_bins,
)
from attnlab.metrics.translation import evaluate_pairs, teacher_forced_tokens
from attnlab.tasks.translation import TranslationTask, train_defaults
from attnlab.train import train
from attnlab.viz.calibration import plot_reliability

__all__ = ["LabelSmoothingConfig", "run_label_smoothing"]

log = logging.getLogger(__name__)


@dataclass
class LabelSmoothingConfig(training.NumbersExperimentConfig):
    """Settings of the label-smoothing experiment (and those of
    :class:`~attnlab.experiments.training.NumbersExperimentConfig`).

    Args:
        epsilons: the smoothing values ε compared.
        model, preset, lr: the translation model (every run the same).
        held_out: fraction of the pairs held out (half validation, half test): a small training
            split (200 pairs by default) makes the unsmoothed model overconfident on held-out
            pairs, and a large test split measures calibration precisely.
        n_bins: confidence bins of the ECE and the reliability diagram.
    """

    epsilons: tuple[float, ...] = (0.0, 0.1, 0.2)
    model: str = "transformer"
    preset: str = "tiny"
    lr: float = 1e-3
    held_out: float = 0.9
    n_bins: int = 15


def run_label_smoothing(
    cfg: LabelSmoothingConfig, out_dir: str | Path, *, overwrite: bool = False
) -> dict:
    """Train one model per ε and measure accuracy, NLL and calibration on held-out tokens.

    Returns:
        ``{"config", "data", "runs": [{"epsilon", "steps", "seconds", "token_accuracy", "nll",
        "ece", "mean_confidence", "exact_match", "reliability": [bins]}], "elapsed",
        "summary"}``.

    Raises:
        RunDirError: ``out_dir`` holds files and ``overwrite`` is not set.
        UserError: a bad setting.
    """
    if not cfg.epsilons or not all(0.0 <= e < 1.0 for e in cfg.epsilons):
        raise UserError(f"label smoothing values must lie in [0, 1), got {cfg.epsilons}")
    budget = common.Budget(cfg.max_time)
    out = common.prepare_out_dir(out_dir, overwrite=overwrite)
    if not 0 < cfg.held_out < 1:
        raise UserError(f"the held-out fraction must lie in (0, 1), got {cfg.held_out}")
    data = training.numbers_data(cfg, val_frac=cfg.held_out / 2, test_frac=cfg.held_out / 2)
    vocabs = data.vocabs()
    test = data.splits["test"][: cfg.max_test]
    torch.manual_seed(cfg.seed)
    init = training.translation_model(cfg.model, data, cfg.preset)
    defaults = train_defaults(cfg.model)
    usual_warmup = 100 if cfg.model == "transformer" else 20
    tcfg = training.train_settings(
        cfg,
        **{
            **defaults,
            "steps": cfg.steps or 1,
            "lr": cfg.lr,
            "warmup_steps": usual_warmup,
            "eval_batches": 5,
        },
    )
    task = TranslationTask(data, eval_examples=0)
    per_step = common.seconds_per_step(init, task, tcfg) if cfg.steps is None else 0.0
    runs = []
    for eps in cfg.epsilons:
        if cfg.steps is None:  # an equal share of what is left, as wall-clock seconds
            left = len(cfg.epsilons) - len(runs)
            reserve = cfg.reserve * cfg.max_time * left / len(cfg.epsilons)
            seconds = max(1.0, budget.share(left, reserve=reserve))
            steps = common.steps_within(seconds, per_step)
            run_cfg = tcfg.replace(steps=None, max_time=seconds)
            log.info("label-smoothing: ε=%g: %.0f s, ~%d steps", eps, seconds, steps)
        else:
            steps = cfg.steps
            run_cfg = tcfg.replace(steps=steps)
        run_cfg = run_cfg.replace(
            label_smoothing=eps, warmup_steps=common.warmup_within(steps, usual_warmup)
        )
        model = copy.deepcopy(init)
        res = train(model, task, run_cfg, out / "runs" / f"eps-{eps:g}")
        logits, targets = teacher_forced_tokens(model, vocabs, test, batch_size=256)
        conf, correct = confidences(logits, targets)
        ev = evaluate_pairs(model, vocabs, test, batch_size=256)
        runs.append(
            {
                "epsilon": eps,
                "steps": res.steps,
                "seconds": res.elapsed,
                "token_accuracy": float(correct.float().mean()),
                "nll": float(F.cross_entropy(logits, targets)),
                "ece": expected_calibration_error(conf, correct, cfg.n_bins),
                "mean_confidence": float(conf.mean()),
                "exact_match": ev["exact_match"],
                "reliability": [b.to_dict() for b in reliability_bins(conf, correct, cfg.n_bins)],
                "tokens": int(targets.numel()),
            }
        )
    results = {"config": asdict(cfg), "data": data.stats, "runs": runs}
    results["summary"] = summarise(results)
    table = common.Table(
        ["ε", "steps", "train s", "token accuracy %", "NLL", "ECE", "mean confidence"]
        + ["exact match %"],
        formats=["g", "d", ".0f", ".2f", ".3f", ".4f", ".3f", ".1f"],
    )
    for r in runs:
        table.add(
            r["epsilon"],
            r["steps"],
            r["seconds"],
            100 * r["token_accuracy"],
            r["nll"],
            r["ece"],
            r["mean_confidence"],
            100 * r["exact_match"],
        )
    notes = (
        f"{cfg.model} `{cfg.preset}`, {data.stats['n_train']} training pairs, "
        f"{runs[0]['tokens']} held-out reference tokens (teacher-forced; NLL without smoothing; "
        f"ECE over {cfg.n_bins} bins); exact match is greedy, per sentence."
    )
    title = "Label smoothing: accuracy, NLL and calibration"
    common.write_outputs(
        out, title, [table], results, notes, plot=(_plot, "reliability.png"), budget=budget
    )
    return results


def _plot(results: dict, path: Path) -> None:
    diagrams = {
        f"ε = {r['epsilon']:g}": [ReliabilityBin(**b) for b in r["reliability"]]
        for r in results["runs"]
    }
    ece = {f"ε = {r['epsilon']:g}": r["ece"] for r in results["runs"]}
    plot_reliability(diagrams, path, ece=ece, title="held-out reference tokens, teacher-forced")


#: every ε must reach this token accuracy before calibration is compared (the README's runs: 48 %)
MIN_TOKEN_ACCURACY = 0.25


def summarise(results: dict) -> str:
    """Which ε is best calibrated, and what smoothing did to confidence, NLL and accuracy."""
    runs = results["runs"]
    cfg = results.get("config") or {}
    short = common.undertrained(  # calibration of a model that has not learnt the task is noise
        {f"ε={r['epsilon']:g}": r["token_accuracy"] for r in runs},
        threshold=MIN_TOKEN_ACCURACY,
        what="held-out token accuracy",
        max_time=cfg.get("max_time"),
        steps=cfg.get("steps"),
        fmt=common.percent,
    )
    if short is not None:
        return short
    best = min(runs, key=lambda r: r["ece"])
    parts = [
        f"ε={r['epsilon']:g}: mean confidence {r['mean_confidence']:.3f} vs accuracy "
        f"{r['token_accuracy']:.3f} (ECE {r['ece']:.4f})"
        for r in runs
    ]
    return (
        "; ".join(parts)
        + f". Lowest calibration error with ε={best['epsilon']:g}."
        + (
            " A confidence above the accuracy is overconfidence, below it underconfidence."
            if len(runs) > 1
            else ""
        )
    )
