"""Length extrapolation, measured: LMs with learned, sinusoidal, RoPE, ALiBi and T5 positions trained
on windows of L tokens and evaluated on windows of L, 2L and 4L.

The claim (the lecture's section on positions; Press et al. 2022 for ALiBi): a learned table has
one row per trained position and cannot go further; the sinusoidal formula gives every position a
vector but the model has never seen those past L; RoPE makes the scores depend on the offset only,
and ALiBi penalises distance linearly, so both are said to carry over to longer inputs (ALiBi
best). Every scheme trains the same ``DecoderLM`` from the same seed for the same number of steps
(sized from the ``max_time`` budget, or ``steps``), on character-level ``pydoc`` windows of
``context`` tokens. The held-out split is cut into windows of the longest evaluated length; each
shorter length reads the same text cut into shorter windows, so every length scores the same
tokens. Per evaluated length: the mean next-token loss, and the loss at each position of the
window (averaged over windows). A learned table of L rows cannot score 2L: the table says so.

Outputs: ``table.md``, ``results.json``, ``loss_by_position.png`` and ``runs/<position>``.

Shape legend: W windows, N evaluated length, V vocab_size.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.errors import UserError
from attnlab.experiments import common
from attnlab.experiments.lm_runs import LMExperimentConfig, lm_model, lm_results, lm_task, train_run
from attnlab.experiments.training import train_settings
from attnlab.layers import evaluating
from attnlab.layers.block import LearnedPositionalEmbedding
from attnlab.layers.position import POSITION_KINDS
from attnlab.plotting import pyplot, save_png
from attnlab.tasks.lm import LMTask

__all__ = [
    "ExtrapolationConfig",
    "run_extrapolation",
    "loss_by_position",
    "cannot_evaluate",
    "POSITIONS",
]

log = logging.getLogger(__name__)

#: the position schemes compared by default
POSITIONS = ("learned", "sinusoidal", "rope", "alibi", "t5")


@dataclass
class ExtrapolationConfig(LMExperimentConfig):
    """Settings of the extrapolation experiment (and :class:`LMExperimentConfig`'s).

    Args:
        positions: the position schemes compared.
        context: the training window L (characters).
        lengths: the evaluated lengths as multiples of L.
        lr: the peak learning rate (warm-up, then cosine decay).
        eval_windows: held-out windows of the longest length scored.
    """

    positions: tuple[str, ...] = POSITIONS
    context: int = 64
    lengths: tuple[int, ...] = (1, 2, 4)
    lr: float = 2e-3
    eval_windows: int = 128
    reserve: float = 0.15


def cannot_evaluate(model: nn.Module, length: int) -> str | None:
    """Why ``model`` cannot score windows of ``length`` tokens, or None when it can.

    A learned position table has one row per position it was built for (``max_seq_len``).
    """
    rows = model.config.max_seq_len
    if length <= rows:
        return None
    if isinstance(model.pos_emb, LearnedPositionalEmbedding):
        return f"n/a: table has {rows} rows"
    return f"n/a: max_seq_len is {rows}"


@torch.no_grad()
def loss_by_position(
    model: nn.Module, idx: Tensor, targets: Tensor, length: int, *, batch_size: int = 64
) -> Tensor:
    """Mean next-token loss at each position of windows of ``length`` tokens.

    Args:
        model: a language model, ``model(idx (B, N)) -> logits (B, N, V)``.
        idx, targets: ``(W, M)`` token ids and next tokens, ``M`` a multiple of ``length``; each
            row is cut into ``M / length`` windows read independently.
        length: N.

    Returns:
        ``(N,)``: the loss at position ``t`` averaged over every window.

    Raises:
        ValueError: ``M`` is not a multiple of ``length``.
    """
    W, M = idx.shape
    if M % length:
        raise ValueError(f"windows of {M} tokens do not cut into pieces of {length}")
    device = next(model.parameters()).device
    x = idx.reshape(-1, length)  # (W·M/N, N)
    y = targets.reshape(-1, length)
    total = torch.zeros(length, dtype=torch.float64)
    with evaluating(model):
        for i in range(0, x.shape[0], batch_size):
            logits = model(x[i : i + batch_size].to(device))  # (b, N, V)
            nll = F.cross_entropy(
                logits.transpose(1, 2).float(), y[i : i + batch_size].to(device), reduction="none"
            )  # (b, N)
            total += nll.sum(0).double().cpu()
    return (total / x.shape[0]).float()


def _eval_windows(task, length: int, n_windows: int) -> tuple[Tensor, Tensor]:
    """The first ``n_windows`` consecutive held-out windows of ``length`` tokens."""
    long = LMTask(task.ids, task.tokenizer, task.config.replace(seq_len=length))
    xs, ys = zip(*long.eval_batches(n_windows, 1))
    idx, tgt = torch.cat(xs), torch.cat(ys)
    if idx.shape[0] == 0:
        raise UserError(f"the held-out split has no window of {length} tokens; lower --context")
    return idx, tgt


def run_extrapolation(
    cfg: ExtrapolationConfig, out_dir: str | Path, *, overwrite: bool = False
) -> dict:
    """Train one LM per position scheme at context L; score each at every evaluated length.

    Returns:
        ``{"config", "data", "runs": [{"position", "steps", "seconds", "train_loss", "lengths":
        {N: {"loss", "by_position", "note"}}, "beyond_context"}], "summary", "elapsed"}``
        (``loss``/``by_position`` None with a ``note`` where the model cannot read N tokens).

    Raises:
        RunDirError: ``out_dir`` holds files and ``overwrite`` is not set.
        UserError: a bad setting.
    """
    bad = [p for p in cfg.positions if p not in POSITION_KINDS]
    if not cfg.positions or bad:
        raise UserError(f"unknown position scheme(s) {bad}; choose from {', '.join(POSITIONS)}")
    if not cfg.lengths or any(m < 1 for m in cfg.lengths):
        raise UserError(f"lengths must be positive multiples of the context, got {cfg.lengths}")
    if cfg.context < 2:
        raise UserError(f"the context must be at least 2 tokens, got {cfg.context}")
    budget = common.Budget(cfg.max_time)
    out = common.prepare_out_dir(out_dir, overwrite=overwrite)
    L = cfg.context
    lengths = sorted({m * L for m in cfg.lengths})
    longest = lengths[-1]
    task = lm_task(cfg.data, L, max_chars=cfg.max_chars, seed=cfg.seed)
    idx, tgt = _eval_windows(task, longest, cfg.eval_windows)

    def build(position: str) -> nn.Module:
        # a learned table is built for the training context; the other schemes for the longest
        # evaluated length (a formula, or no table at all: the same parameters either way)
        rows = L if position == "learned" else longest
        return lm_model(
            cfg.preset,
            task.vocab_size,
            seed=cfg.seed,
            max_seq_len=rows,
            position=position,
            d_model=cfg.d_model,
        )

    tcfg = train_settings(cfg, steps=cfg.steps or 1, lr=cfg.lr, eval_batches=0, log_every=10)
    if cfg.steps is None:  # one speed for all: the schemes cost nearly the same
        per_step = common.seconds_per_step(build(cfg.positions[0]), task, tcfg)
        share = budget.share(len(cfg.positions), reserve=cfg.reserve * cfg.max_time)
        steps = common.steps_within(share, per_step, minimum=10)
        log.info("extrapolation: %d steps per model (%.3f s/step)", steps, per_step)
    else:
        steps = cfg.steps
    tcfg = tcfg.replace(steps=steps, warmup_steps=common.warmup_within(steps, 100))

    runs = []
    for position in cfg.positions:
        model = build(position)
        res = train_run(model, task, tcfg, out / "runs" / position)
        by_length = {}
        for n in lengths:
            why = cannot_evaluate(model, n)
            if why is not None:
                by_length[n] = {"loss": None, "by_position": None, "note": why}
                continue
            per_pos = loss_by_position(model, idx, tgt, n)
            by_length[n] = {
                "loss": float(per_pos.mean()),
                "by_position": [round(float(v), 5) for v in per_pos],
                "note": "",
            }
        top = by_length[longest]["by_position"]
        runs.append(
            {
                "position": position,
                "steps": res["steps"],
                "seconds": res["seconds"],
                "train_loss": res["final_loss"],
                "diverged": res["diverged"],
                "lengths": {str(n): v for n, v in by_length.items()},
                "within_context": None if top is None else statistics.fmean(top[:L]),
                "beyond_context": (
                    None if top is None or longest == L else statistics.fmean(top[L:])
                ),
            }
        )
    data = {"eval_tokens": int(tgt.numel()), "context": L, "lengths": lengths}
    results = lm_results(cfg, task, data=data, runs=runs)
    results["summary"] = summarise(results)
    table = _table(results)
    notes = (
        f"`{cfg.preset}` DecoderLM per scheme, trained {steps} steps on windows of L = {L} "
        f"characters of `{cfg.data}` (batch {cfg.batch_size}, lr {cfg.lr:g}); loss in nats per "
        f"character on the same {int(tgt.numel())} held-out characters at every length. "
        f'"beyond L" is the mean loss at positions {L}…{longest - 1} of the {longest}-token '
        f'windows, "within L" at positions 0…{L - 1} of the same windows.'
    )
    drawn = (plot_loss_by_position, "loss_by_position.png")
    title = "Length extrapolation: trained at L, evaluated at L, 2L, 4L"
    common.write_outputs(out, title, [table], results, notes, plot=drawn, budget=budget)
    return results


def _table(results: dict) -> common.Table:
    L = results["data"]["context"]
    lengths = results["data"]["lengths"]
    names = {n: ("L" if n == L else f"{n // L}L") for n in lengths}
    cols = ["positions", "steps", "train loss"] + [f"loss @ {names[n]} = {n}" for n in lengths]
    beyond = lengths[-1] > L
    if beyond:
        cols += [f"within L @ {lengths[-1]}", f"beyond L @ {lengths[-1]}"]
    table = common.Table(cols, formats=["", "d", ".3f"] + [".3f"] * (len(cols) - 3))
    for r in results["runs"]:
        cells = [r["lengths"][str(n)] for n in lengths]
        row = [r["position"], r["steps"], r["train_loss"]]
        row += [c["loss"] if c["loss"] is not None else c["note"] for c in cells]
        if beyond:
            note = r["lengths"][str(lengths[-1])]["note"]
            row += [note if v is None else v for v in (r["within_context"], r["beyond_context"])]
        table.add(*row)
    return table


#: every scheme must read the trained length this well (nats per character; letter frequencies
#: alone give about 3.2, the README's runs 2.03-2.08) before its loss past L is compared
MAX_LOSS_AT_L = 2.6


def summarise(results: dict) -> str:
    """How much each scheme's loss rises from L to the longest length, best first."""
    L = results["data"]["context"]
    longest = results["data"]["lengths"][-1]
    if longest == L:
        return ""
    parts, refused = [], []
    for r in results["runs"]:
        at_l = r["lengths"][str(L)]["loss"] if str(L) in r["lengths"] else None
        far = r["lengths"][str(longest)]["loss"]
        if far is None:
            refused.append(r["position"])
        elif at_l is not None:
            parts.append((far - at_l, r["position"], at_l, far))
    parts.sort()
    cfg = results.get("config") or {}
    short = common.undertrained(  # a model that has not learnt L extrapolates nothing
        {r["position"]: (r["lengths"].get(str(L)) or {}).get("loss") for r in results["runs"]},
        threshold=MAX_LOSS_AT_L,
        what=f"the loss at the trained length L = {L} (nats per character)",
        higher_is_better=False,
        max_time=cfg.get("max_time"),
        steps=cfg.get("steps"),
        fmt=lambda v: f"{v:.2f}",
    )
    if short is not None:
        return short
    text = "; ".join(f"{p}: {a:.3f} → {b:.3f} ({d:+.3f})" for d, p, a, b in parts)
    out = f"Loss at L = {L} → {longest}: {text}." if parts else ""
    if refused:
        out += f" Not defined past L: {', '.join(refused)} (a table of L rows)."
    return out.strip()


def plot_loss_by_position(results: dict, path: str | Path) -> None:
    """Loss by position at the longest length (learned: at L), a dashed line at L."""
    plt = pyplot()

    L = results["data"]["context"]
    lengths = results["data"]["lengths"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in results["runs"]:
        n = (
            max(int(k) for k, v in r["lengths"].items() if v["by_position"] is not None)
            if any(v["by_position"] is not None for v in r["lengths"].values())
            else None
        )
        if n is None:
            continue
        ys = r["lengths"][str(n)]["by_position"]
        width = max(1, lengths[-1] // 64)  # average neighbouring positions: readable curves
        xs = [i + (width - 1) / 2 for i in range(0, n, width)]
        means = [statistics.fmean(ys[i : i + width]) for i in range(0, n, width)]
        ax.plot(xs, means, label=f"{r['position']} (windows of {n})")
    ax.axvline(L - 0.5, color="grey", linestyle="--", linewidth=1)
    ax.text(L, ax.get_ylim()[1], " training context L", va="top", fontsize=8, color="grey")
    ax.set_xlabel("position in the window")
    ax.set_ylabel("held-out loss (nats/char)")
    ax.set_title(f"trained at L = {L}, evaluated up to {lengths[-1]}")
    ax.legend(fontsize=8)
    save_png(fig, path)
