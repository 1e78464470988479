"""Exposure bias, measured: teacher forcing against scheduled sampling for rnn-attn and transformer.

The lecture's claim: teacher forcing trains the decoder only on gold prefixes, but at test time it
reads its own outputs, so it never learned to continue from its own mistakes (exposure bias).
Scheduled sampling (Bengio et al. 2015) feeds the model its own greedy predictions with a
probability that grows over training: the gold-token probability ε_i decays linearly,
exponentially or by inverse sigmoid (:class:`attnlab.config.ScheduledSamplingConfig`).

Every model kind is trained once with teacher forcing and once per decay, from the same initial
weights, on the ``numbers`` task: for ``steps`` steps each, or, with ``max_time``, for the
steps that an equal share of the budget buys at the slower of the two step kinds (teacher-forced
or sampling), measured by a timing probe — every run of a kind trains for the same steps (the
table gives them and the seconds each took). Each decay is fitted to the run's (planned) length: ε = 1/2 at
``half_at`` of the steps. On held-out pairs the experiment measures

- the teacher-forced NLL of the references and their NLL when the decoder reads its own greedy
  predictions (:func:`attnlab.metrics.exposure.prefix_losses`), and the gap between them;
- greedy exact match, overall and by reference length (target tokens);
- the token error rate by output position, free-running (greedy, reading its own outputs) and
  teacher-forced (reading the gold prefix), and how fast the free-running rate grows with the
  position: per sentence, its error rate in the last position bucket minus the first, averaged
  over the sentences that reach the last bucket (± standard error), and, for each schedule, that
  growth minus teacher forcing's on the same sentences (a paired z-score).

The targets are spelt out one character per token by default (``tgt_level="char"``: "ventitre"
is 8 tokens; references of 4 to 54 tokens, ``<end>`` included), so that an early mistake has
many later positions over which to compound; ``tgt_level="bpe"`` gives the short (at most 6
tokens) targets of the translation runs.

Outputs in the experiment directory: ``table.md``, ``results.json``, ``exposure_bias.png`` (the
schedules, the two losses per run, exact match by output length) and ``runs/<model>-<training>``.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import torch

from attnlab.config.translation import ScheduledSamplingConfig
from attnlab.errors import UserError
from attnlab.experiments import common, training
from attnlab.metrics.exposure import prefix_losses
from attnlab.metrics.significance import describe_z, mean_se, paired_z
from attnlab.metrics.translation import evaluate_pairs
from attnlab.models.translation import TRANSLATION_KINDS
from attnlab.plotting import pyplot, save_png
from attnlab.tasks.translation import TranslationTask, train_defaults
from attnlab.train import train

__all__ = [
    "ExposureBiasConfig",
    "run_exposure_bias",
    "schedule_for",
    "DECAYS",
    "length_buckets",
    "position_buckets",
    "error_by_position",
    "error_growth",
]

log = logging.getLogger(__name__)

DECAYS = ("linear", "exponential", "inverse_sigmoid")
TEACHER_FORCING = "teacher forcing"
#: sentences that must reach the last position bucket before a growth is read
MIN_LATE_SENTENCES = 20


@dataclass
class ExposureBiasConfig(training.NumbersExperimentConfig):
    """Settings of the exposure-bias experiment (and those of
    :class:`~attnlab.experiments.training.NumbersExperimentConfig`).

    Args:
        models: translation kinds to compare (``rnn-attn``, ``transformer``, ``rnn``).
        decays: scheduled-sampling decays to run next to teacher forcing.
        half_at: fraction of the run at which the gold-token probability reaches 1/2.
        min_gold: floor of the gold-token probability.
        rnn_preset, transformer_preset, rnn_lr, transformer_lr: the models and their peak
            learning rates.
        n_length_buckets: output-length buckets of the exact-match columns.
        tgt_level: how the targets are tokenised: ``char`` (long targets, where errors can
            compound) or ``bpe`` (at most 6 tokens).
        position_bucket, n_position_buckets: the output positions of the error-rate columns:
            buckets of ``position_bucket`` positions, the last one open-ended.
        n_examples, batch_size: 20,000 pairs, 64 per step.
    """

    models: tuple[str, ...] = ("rnn-attn", "transformer")
    decays: tuple[str, ...] = DECAYS
    half_at: float = 0.5
    min_gold: float = 0.0
    rnn_preset: str = "tiny"
    transformer_preset: str = "tiny"
    rnn_lr: float = 2e-3
    transformer_lr: float = 1e-3
    n_length_buckets: int = 4
    tgt_level: Literal["char", "bpe"] = "char"
    position_bucket: int = 10
    n_position_buckets: int = 4
    n_examples: int = 20_000
    batch_size: int = 64

    def validate(self) -> None:
        super().validate()
        self.positive("position_bucket", "n_position_buckets")


#: every run must reach this exact match on the shortest targets before its gap is read (the
#: documented 300-step runs: 65-90 %; a few steps: about 0)
SHORTEST_EXACT_MATCH = 0.2


def schedule_for(
    decay: str, steps: int, *, half_at: float = 0.5, min_gold: float = 0.0
) -> ScheduledSamplingConfig:
    """A decay of the gold-token probability fitted to a run of ``steps`` steps: ε = 1/2 at step
    ``half_at · steps``.

    linear: ε_i = 1 − c·i with c = 1/(2m); exponential: ε_i = k^i with k = 2^(−1/m); inverse
    sigmoid: ε_i = k/(k + e^(i/k)) with k·ln k = m (m = ``half_at · steps``).

    Raises:
        ValueError: unknown ``decay``.
    """
    m = max(1.0, half_at * steps)
    if decay == "linear":
        return ScheduledSamplingConfig(decay="linear", k=1.0, c=1 / (2 * m), min_gold=min_gold)
    if decay == "exponential":
        return ScheduledSamplingConfig(decay="exponential", k=0.5 ** (1 / m), min_gold=min_gold)
    if decay == "inverse_sigmoid":
        lo, hi = 1.0, max(2.0, m)  # k ln k is increasing on k >= 1: bisect k ln k = m
        for _ in range(100):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if mid * math.log(mid) < m else (lo, mid)
        return ScheduledSamplingConfig(decay="inverse_sigmoid", k=(lo + hi) / 2, min_gold=min_gold)
    raise ValueError(f"unknown decay {decay!r}; choose from {DECAYS}")


def length_buckets(lengths: list[int], n: int) -> list[tuple[int, int]]:
    """About ``n`` contiguous ``(lo, hi)`` length ranges holding similar numbers of sentences."""
    values = sorted(lengths)
    edges: list[tuple[int, int]] = []
    lo = values[0]
    for q in range(1, n + 1):
        hi = values[min(len(values) - 1, math.ceil(q * len(values) / n) - 1)]
        if hi >= lo:
            edges.append((lo, hi))
            lo = hi + 1
    return edges


def _label(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}–{hi}"


def position_buckets(width: int, n: int) -> list[tuple[int, int | None]]:
    """``n`` buckets of output positions (1-based, inclusive) ``width`` wide, the last one
    open-ended (``hi`` None): ``position_buckets(10, 3) == [(1, 10), (11, 20), (21, None)]``."""
    return [(1 + k * width, None if k == n - 1 else (k + 1) * width) for k in range(n)]


def _position_label(lo: int, hi: int | None) -> str:
    return f"{lo}+" if hi is None else _label(lo, hi)


def error_by_position(
    wrong: list[list[bool]], buckets: list[tuple[int, int | None]]
) -> dict[str, dict[str, float | int]]:
    """Per position bucket: ``{"rate": wrong tokens / tokens, "tokens": tokens}`` over all
    sentences (``rate`` NaN where no sentence reaches the bucket)."""
    out = {}
    for lo, hi in buckets:
        cells = [w for row in wrong for w in row[lo - 1 : hi]]
        rate = sum(cells) / len(cells) if cells else float("nan")
        out[_position_label(lo, hi)] = {"rate": rate, "tokens": len(cells)}
    return out


def error_growth(wrong: list[list[bool]], buckets: list[tuple[int, int | None]]) -> list[float]:
    """Per sentence that reaches the last bucket: its error rate there minus its error rate in
    the first bucket (in order of ``wrong``; shorter sentences are left out)."""
    (lo0, hi0), (lo1, hi1) = buckets[0], buckets[-1]
    out = []
    for row in wrong:
        if len(row) >= lo1:
            late, early = row[lo1 - 1 : hi1], row[lo0 - 1 : hi0]
            out.append(sum(late) / len(late) - sum(early) / len(early))
    return out


def run_exposure_bias(
    cfg: ExposureBiasConfig, out_dir: str | Path, *, overwrite: bool = False
) -> dict:
    """Train and measure every (model, training) pair; write the table and the plot.

    Returns:
        ``{"config", "data", "buckets", "runs": [{"model", "training", "schedule", "steps",
        "seconds", "teacher_forced_nll", "free_running_nll", "gap", "exact_match",
        "exact_by_length"}], "elapsed", "summary"}``.

    Raises:
        RunDirError: ``out_dir`` holds files and ``overwrite`` is not set.
        UserError: a bad setting (unknown model or decay, a budget too small...).
    """
    for kind in cfg.models:
        if kind not in TRANSLATION_KINDS:
            raise UserError(f"unknown model {kind!r}; choose from {list(TRANSLATION_KINDS)}")
    for decay in cfg.decays:
        if decay not in DECAYS:
            raise UserError(f"unknown decay {decay!r}; choose from {list(DECAYS)}")
    budget = common.Budget(cfg.max_time)
    out = common.prepare_out_dir(out_dir, overwrite=overwrite)
    data = training.numbers_data(cfg, tgt_level=cfg.tgt_level)
    vocabs = data.vocabs()
    test = data.splits["test"][: cfg.max_test]
    lengths = [len(vocabs.tgt.tokenize(t)) for _, t in test]
    buckets = length_buckets(lengths, cfg.n_length_buckets)
    positions = position_buckets(cfg.position_bucket, cfg.n_position_buckets)
    growths: dict[str, list[float]] = {}  # per run: the growth of each long-enough sentence
    reserve = cfg.reserve * cfg.max_time
    variants = (TEACHER_FORCING, *cfg.decays)
    n_runs = len(cfg.models) * len(variants)
    runs: list[dict] = []

    def task_with(ss: ScheduledSamplingConfig) -> TranslationTask:
        d = dataclasses.replace(data, config=data.config.replace(scheduled_sampling=ss.to_dict()))
        return TranslationTask(d, eval_examples=0)

    for kind in cfg.models:
        is_tf = kind == "transformer"
        torch.manual_seed(cfg.seed)
        init = training.translation_model(
            kind, data, cfg.transformer_preset if is_tf else cfg.rnn_preset
        )
        usual_warmup = 100 if is_tf else 20
        tcfg = training.train_settings(
            cfg,
            steps=cfg.steps or 1,
            lr=cfg.transformer_lr if is_tf else cfg.rnn_lr,
            warmup_steps=usual_warmup,
            eval_batches=5,
            **train_defaults(kind),
        )
        if cfg.steps is None:  # seconds per step, to fit each decay to the run's length
            t_tf = common.seconds_per_step(init, task_with(ScheduledSamplingConfig()), tcfg)
            probe = ScheduledSamplingConfig(decay="linear", k=0.5, c=1e-9)  # always sampling
            t_ss = common.seconds_per_step(init, task_with(probe), tcfg) if cfg.decays else t_tf
        kind_steps = None  # every run of a kind trains for the same steps
        for variant in variants:
            if cfg.steps is None:  # an equal share of what is left, priced at the slower step
                left = n_runs - len(runs)
                seconds = max(1.0, budget.share(left, reserve=reserve * left / n_runs))
                if kind_steps is None:
                    kind_steps = common.steps_within(seconds, max(t_tf, t_ss))
                steps = kind_steps
                run_cfg = tcfg.replace(steps=steps)
                log.info(
                    "exposure-bias: %s %s: %d steps (%.0f s share)", kind, variant, steps, seconds
                )
            else:
                steps = cfg.steps
                run_cfg = tcfg.replace(steps=steps)
            run_cfg = run_cfg.replace(warmup_steps=common.warmup_within(steps, usual_warmup))
            ss = (
                ScheduledSamplingConfig()
                if variant == TEACHER_FORCING
                else schedule_for(variant, steps, half_at=cfg.half_at, min_gold=cfg.min_gold)
            )
            model = copy.deepcopy(init)
            name = f"{kind}-{variant.replace(' ', '-')}"
            res = train(model, task_with(ss), run_cfg, out / "runs" / name)
            losses = prefix_losses(model, vocabs, test, batch_size=256)
            ev = evaluate_pairs(model, vocabs, test, batch_size=256)
            by_length = {}
            for lo, hi in buckets:
                idx = [j for j, n in enumerate(lengths) if lo <= n <= hi]
                by_length[_label(lo, hi)] = sum(ev["correct"][j] for j in idx) / len(idx)
            tf = statistics.fmean(losses["teacher_forced"])
            free = statistics.fmean(losses["free_running"])
            growths[name] = error_growth(losses["free_running_wrong"], positions)
            growth = mean_se(growths[name]) if len(growths[name]) >= 2 else (float("nan"),) * 2
            paired = _against_teacher_forcing(growths, kind, name)
            runs.append(
                {
                    "model": kind,
                    "training": variant,
                    "schedule": ss.to_dict(),
                    "final_gold_prob": ss.gold_probability(res.steps),
                    "planned_steps": steps,
                    "steps": res.steps,
                    "seconds": res.elapsed,
                    "teacher_forced_nll": tf,
                    "free_running_nll": free,
                    "gap": free - tf,
                    "exact_match": ev["exact_match"],
                    "exact_by_length": by_length,
                    "error_by_position": {
                        "free_running": error_by_position(losses["free_running_wrong"], positions),
                        "teacher_forced": error_by_position(
                            losses["teacher_forced_wrong"], positions
                        ),
                    },
                    "growth": growth[0],
                    "growth_se": growth[1],
                    "growth_sentences": len(growths[name]),
                    **paired,
                }
            )
    bucket_labels = [_label(lo, hi) for lo, hi in buckets]
    results = {
        "config": asdict(cfg),
        "data": data.stats,
        "buckets": bucket_labels,
        "position_buckets": [_position_label(lo, hi) for lo, hi in positions],
        "bucket_sizes": [sum(lo <= n <= hi for n in lengths) for lo, hi in buckets],
        "runs": runs,
    }
    results["summary"] = summarise(results)
    table = results_table(results)
    by_position = position_table(results)
    budget_note = (
        f"every run trained for {cfg.steps} steps"
        if cfg.steps is not None
        else f"every run of a kind trained for the steps its share of --max-time {cfg.max_time:g} s buys"
    )
    notes = (
        f"NLL in nats per reference token on {len(test)} held-out pairs; gap = free-running − "
        f"teacher-forced. Exact match (greedy) by reference length in target tokens "
        f"(pairs per bucket: {', '.join(map(str, results['bucket_sizes']))}). Schedules reach "
        f"ε = 1/2 at {cfg.half_at:.2f} of the run's (planned) steps; {budget_note}, from the "
        f"same initial weights per model.\n\nError rate by output position: the share of "
        f"reference tokens at those positions that the argmax gets wrong, free-running (FR, "
        f"greedy, reading its own outputs; after a wrong or missing character every later one "
        f"is compared at its position) and teacher-forced (TF, gold prefix). Growth = a "
        f"sentence's free-running error rate at positions {results['position_buckets'][-1]} "
        f"minus at positions {results['position_buckets'][0]}, mean ± standard error over the "
        f"{runs[0]['growth_sentences']} test sentences that long; z: the schedule's growth "
        f"minus teacher forcing's on the same sentences, paired (|z| ≥ 1.96: 95 % confident of "
        f"the sign; z < 0: errors compound more slowly than with teacher forcing)."
    )
    drawn = (plot_exposure_bias, "exposure_bias.png")
    title = "Exposure bias: teacher forcing vs scheduled sampling"
    common.write_outputs(
        out, title, [table, by_position], results, notes, plot=drawn, budget=budget
    )
    return results


def results_table(results: dict) -> common.Table:
    """One row per run: steps, the two NLLs, the gap, exact match overall and by length."""
    buckets = results["buckets"]
    table = common.Table(
        ["model", "training", "steps", "train s", "teacher-forced NLL", "free-running NLL", "gap"]
        + ["EM %"]
        + [f"EM % len {b}" for b in buckets],
        formats=["", "", "d", ".0f", ".3f", ".3f", ".3f", ".1f"] + [".1f"] * len(buckets),
    )
    for r in results["runs"]:
        table.add(
            r["model"],
            r["training"],
            r["steps"],
            r["seconds"],
            r["teacher_forced_nll"],
            r["free_running_nll"],
            r["gap"],
            100 * r["exact_match"],
            *(100 * r["exact_by_length"][b] for b in buckets),
        )
    return table


def _against_teacher_forcing(growths: dict[str, list[float]], kind: str, name: str) -> dict:
    """``{"growth_minus_tf", "growth_z"}``: the run's growth minus the teacher-forced run's of
    the same model, sentence by sentence (empty for the teacher-forced run itself)."""
    tf = growths.get(f"{kind}-{TEACHER_FORCING.replace(' ', '-')}")
    if tf is None or name.endswith(TEACHER_FORCING.replace(" ", "-")) or len(tf) < 2:
        return {}
    diffs = [a - b for a, b in zip(growths[name], tf)]  # the same test sentences, in order
    return {"growth_minus_tf": statistics.fmean(diffs), "growth_z": paired_z(diffs)}


def position_table(results: dict) -> common.Table:
    """One row per run: free-running and teacher-forced error rate (%) by output position, the
    growth of the free-running rate (± SE) and its paired z against teacher forcing."""
    labels = results["position_buckets"]
    table = common.Table(
        ["model", "training"]
        + [f"FR err % pos {b}" for b in labels]
        + [f"TF err % pos {b}" for b in labels]
        + ["growth pp", "± SE", "minus TF pp", "z vs TF"],
        formats=["", ""] + [".1f"] * (2 * len(labels)) + [".1f", ".1f", "+.1f", "+.1f"],
    )
    for r in results["runs"]:
        errors = r["error_by_position"]
        table.add(
            r["model"],
            r["training"],
            *(100 * errors["free_running"][b]["rate"] for b in labels),
            *(100 * errors["teacher_forced"][b]["rate"] for b in labels),
            100 * r["growth"],
            100 * r["growth_se"],
            100 * r["growth_minus_tf"] if "growth_minus_tf" in r else None,
            r.get("growth_z"),
        )
    return table


def summarise(results: dict) -> str:
    """Per model: the teacher-forcing gap against the scheduled-sampling gaps; or, when a run
    cannot yet translate the shortest targets, "Undertrained … train longer"."""
    cfg = results.get("config") or {}
    first = results["buckets"][0]
    short = common.undertrained(  # a gap between two untrained models says nothing of drift
        {f"{r['model']} {r['training']}": r["exact_by_length"][first] for r in results["runs"]},
        threshold=SHORTEST_EXACT_MATCH,
        what=f"exact match on the shortest targets (length {first})",
        budget=cfg,
        fmt=common.percent,
    )
    if short is not None:
        return short
    parts = []
    for kind in dict.fromkeys(r["model"] for r in results["runs"]):
        rows = [r for r in results["runs"] if r["model"] == kind]
        tf = next((r for r in rows if r["training"] == TEACHER_FORCING), None)
        ss = [r for r in rows if r["training"] != TEACHER_FORCING]
        if tf is None or not ss:
            continue
        smaller = sum(r["gap"] < tf["gap"] for r in ss)
        gaps = ", ".join(f"{r['training']} {r['gap']:.3f}" for r in ss)
        best = max(ss, key=lambda r: r["exact_match"])
        parts.append(
            f"{kind}: gap {tf['gap']:.3f} with teacher forcing, {gaps} with scheduled sampling "
            f"({smaller} of {len(ss)} smaller); exact match {100 * tf['exact_match']:.1f}% "
            f"(teacher forcing) vs {100 * best['exact_match']:.1f}% (best schedule, "
            f"{best['training']}). {_growth_reading(tf, ss)}".strip()
        )
    return " ".join(parts)


def _growth_reading(tf: dict, ss: list[dict]) -> str:
    """One sentence: does the free-running error rate grow faster with teacher forcing?"""
    if "growth_sentences" not in tf:  # results of a run without the position columns
        return ""
    if tf["growth_sentences"] < MIN_LATE_SENTENCES:
        return (
            f"Too few sentences ({tf['growth_sentences']}) reach the last position bucket to "
            "compare how errors grow along the output."
        )
    slower = [r for r in ss if r.get("growth_z", 0.0) <= -1.96]
    faster = [r for r in ss if r.get("growth_z", 0.0) >= 1.96]
    each = ", ".join(
        f"{r['training']} {100 * r['growth']:.1f} ({describe_z(r['growth_z'])})"
        for r in ss
        if "growth_z" in r
    )
    head = (
        f"Free-running errors grow along the output by {100 * tf['growth']:.1f} ± "
        f"{100 * tf['growth_se']:.1f} points with teacher forcing; {each} with scheduled sampling"
    )
    if len(slower) == len(ss):
        return f"{head}: every schedule compounds errors more slowly, as the lecture argues."
    if faster:
        return f"{head}: errors do NOT compound more slowly with scheduled sampling here."
    return f"{head}: no schedule-wide difference in how fast errors compound at this budget."


def plot_exposure_bias(results: dict, path: str | Path) -> None:
    """Three panels: ε over training, the two NLLs per run, exact match by output length."""
    plt = pyplot()

    runs = results["runs"]
    fig, (ax0, ax1, ax2) = plt.subplots(1, 3, figsize=(15, 4.2))
    shown = set()
    for r in runs:
        if r["training"] in shown:
            continue
        shown.add(r["training"])
        ss = ScheduledSamplingConfig.from_dict(r["schedule"])
        xs = list(range(0, r["steps"] + 1, max(1, r["steps"] // 200)))
        ax0.plot(
            [x / max(1, r["steps"]) for x in xs],
            [ss.gold_probability(x) for x in xs],
            label=r["training"],
        )
    ax0.set_xlabel("fraction of training")
    ax0.set_ylabel("P(feed the gold token)")
    ax0.set_title("schedules")
    ax0.legend(fontsize=8)
    labels = [f"{r['model']}\n{r['training']}" for r in runs]
    xs = range(len(runs))
    ax1.bar(
        [x - 0.2 for x in xs], [r["teacher_forced_nll"] for r in runs], 0.4, label="teacher-forced"
    )
    ax1.bar(
        [x + 0.2 for x in xs], [r["free_running_nll"] for r in runs], 0.4, label="own predictions"
    )
    ax1.set_xticks(list(xs), labels, fontsize=6, rotation=60, ha="right")
    ax1.set_ylabel("held-out NLL (nats/token)")
    ax1.set_title("reference loss: gold prefix vs own prefix")
    ax1.legend(fontsize=8)
    buckets = results["buckets"]
    styles = ["-", "--", ":", "-."]
    kinds = list(dict.fromkeys(r["model"] for r in runs))
    for r in runs:
        ax2.plot(
            range(len(buckets)),
            [100 * r["exact_by_length"][b] for b in buckets],
            styles[kinds.index(r["model"]) % len(styles)],
            marker="o",
            label=f"{r['model']} {r['training']}",
        )
    ax2.set_xticks(range(len(buckets)), buckets)
    ax2.set_xlabel("reference length (target tokens)")
    ax2.set_ylabel("exact match (%)")
    ax2.set_title("greedy exact match by output length")
    ax2.legend(fontsize=6)
    save_png(fig, path)
