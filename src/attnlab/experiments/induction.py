"""Induction heads, measured: attention-only Transformers of 1 and 2 layers trained on sequences
with repeated spans (Olsson et al. 2022, "In-context Learning and Induction Heads").

Each training window (T tokens) is a base sequence — uniform random tokens, or a window of the
``pydoc`` corpus read by characters — in which a span ``s`` of random length L (``min_span·T …
max_span·T``) starting at a random place is repeated until the window ends: ``… s s s``. A
repeated token is predictable only from the context, and only by a model that finds the
previous occurrence of the current token and reads what followed it; L varies, so no fixed
offset (a position shortcut) finds it. The claims: a 2-layer model forms an *induction head* —
a layer-2 head attending from a token to the token right after that token's previous occurrence
(prefix matching), fed by a layer-1 head attending to the previous token — and so predicts the
repeats far below chance (ln V); a 1-layer model cannot (its keys know only their own token and
place); the head forms abruptly, its score jumping at the step the loss drops; ablating the
previous-token head removes the effect.

Measured over training with Olsson et al.'s definitions, on a fixed probe of repeated random
tokens ``[r, r]`` (``r`` of ``T/2`` tokens of the vocabulary):

- prefix-matching score of each head: its mean attention from position ``T/2 + i`` (token
  ``r_i`` again) to position ``i + 1`` (the token after ``r_i``'s first occurrence);
- previous-token score of each head: its mean attention from ``t`` to ``t − 1``;
- the loss on the second copy of ``r`` (and on the first), against ``ln V`` and against the
  *copy-any* level ``ln(distinct tokens of r)`` (a model that knows the next token is one of the
  context's but not which);
- on held-out windows of the training distribution: the in-context-learning score (loss late
  in the window, its last quarter, minus early, its first quarter) and the loss on the repeats
  against the loss on the span's first occurrence.

At the end, each deepest model's previous-token heads (the layer-1 heads of high previous-token
score; a model may spread the job over several) are zero-ablated with
:func:`attnlab.inspect.ablate_heads` and the probe re-measured; so are the best of them alone
and, as a control, the other layer-1 heads.

Outputs: ``table.md``, ``results.json``, ``induction_heads.png`` and
``runs/<setting>-<n>-layer``.

Shape legend: B batch, T sequence length, H heads, V vocab_size.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config.lm import ModelConfig
from attnlab.errors import UserError
from attnlab.experiments import common, tiny_lm
from attnlab.experiments.grokking import save_run
from attnlab.experiments.induction_data import (
    SETTINGS,
    TokenSource,
    insert_repeats,
    repeated_spans,
    repeated_tokens,
)
from attnlab.experiments.tiny_lm import TinyLMSettings
from attnlab.inspect import ablate_heads
from attnlab.models.lm import DecoderLM
from attnlab.plotting import pyplot, save_png

__all__ = [
    "InductionConfig",
    "SETTINGS",
    "TokenSource",
    "insert_repeats",
    "repeated_spans",
    "repeated_tokens",
    "attention_only_lm",
    "probe",
    "train_induction",
    "analyse",
    "ablations",
    "previous_token_heads",
    "copy_any_loss",
    "run_induction",
]

#: the base sequences: uniform random tokens, or the pydoc corpus by characters

#: the deepest model's second-copy loss must sit this many nats under ln V (chance) before its
#: heads are read (a few steps stay at ln V; the documented 2-layer runs reach ≤ 0.3)
BELOW_CHANCE = 0.3

#: the settings' ranges (a CPU experiment: larger values are mistakes, refused before building)
BOUNDS = {
    **tiny_lm.BOUNDS, "layers": (1, 48), "vocab_size": (2, 65536), "seq_len": (8, 4096),
    "eval_every": (1, 10**7), "threshold": (0.0, 1.0),
}  # fmt: skip


@dataclass
class InductionConfig(TinyLMSettings):
    """Settings of the induction-heads experiment (and those of :class:`TinyLMSettings`).

    Args:
        layers: one attention-only model per depth (default 1 and 2).
        settings: the base sequences, ``random`` and/or ``pydoc`` (see :data:`SETTINGS`).
        vocab_size: random tokens of the ``random`` setting (``pydoc`` uses its characters).
        seq_len: the window T (even: the probe is two halves).
        d_model, n_heads: the model.
        batch_size, lr: AdamW at a constant rate.
        eval_every: steps between measurements (None: about 60 over a run of ``steps``, every
            25 steps for one fitted into the budget).
        threshold: the prefix-matching score above which a head counts as an induction head.
        position: the position scheme (``rope``: a previous-token head is one relative offset).
        min_span, max_span: the repeated span's shortest and longest length, fractions of T.
        max_chars: characters of pydoc read (None: all, ~465k).
        device: as for training.
    """

    layers: tuple[int, ...] = (1, 2)
    settings: tuple[str, ...] = SETTINGS
    vocab_size: int = 32
    seq_len: int = 32
    d_model: int = 128
    lr: float = 1e-3
    eval_every: int | None = None
    threshold: float = 0.3
    min_span: float = 0.125
    max_span: float = 0.5
    device: str = "cpu"


def attention_only_lm(
    cfg: InductionConfig, n_layers: int, vocab_size: int | None = None
) -> nn.Module:
    """An attention-only :class:`DecoderLM` (``ffn="none"``, untied unembedding, ``cfg.position``)
    of ``n_layers`` layers, initialised under ``cfg.seed``."""
    mcfg = ModelConfig.preset(
        "tiny",
        vocab_size=vocab_size or cfg.vocab_size,
        max_seq_len=cfg.seq_len,
        n_layers=n_layers,
        d_model=cfg.d_model,
        n_heads=cfg.n_heads,
        ffn="none",
        position=cfg.position,
        tie_embeddings=False,
        dropout=0.0,
    )
    torch.manual_seed(cfg.seed)
    return DecoderLM(mcfg)


def _nll(model: nn.Module, x: Tensor) -> Tensor:
    """Per-position loss ``(B, T − 1)`` of predicting ``x[:, 1:]``."""
    logits = model(x[:, :-1])
    return F.cross_entropy(logits.transpose(1, 2).float(), x[:, 1:], reduction="none")


@torch.no_grad()
def probe(model: nn.Module, rep: Tensor, held_out: Tensor, copied: Tensor | None = None) -> dict:
    """Olsson et al.'s measurements of ``model`` on the probe ``rep`` ``[r, r]`` and on
    ``held_out`` windows of the training distribution (``copied``: their mask of repeated tokens,
    from :func:`insert_repeats`).

    Returns:
        ``{"prefix": [[score per head] per layer], "prev": [[...] per layer], "second_copy_loss",
        "first_copy_loss", "icl_score", "repeat_loss", "span_loss"}`` (the last two: held-out loss
        on the repeated tokens and on the rest; None without ``copied``).
    """
    was = model.training
    model.eval()
    B, T = rep.shape
    half = T // 2
    logits, weights = model(rep, need_weights=True)  # weights: per layer (B, H, T, T)
    i = torch.arange(half - 1)
    prefix = [w[:, :, half + i, i + 1].mean((0, 2)).tolist() for w in weights]
    t = torch.arange(1, T)
    prev = [w[:, :, t, t - 1].mean((0, 2)).tolist() for w in weights]
    nll = F.cross_entropy(logits[:, :-1].transpose(1, 2).float(), rep[:, 1:], reduction="none")
    second = float(nll[:, half : T - 1].mean())  # predictions of r_1 … r_{T/2-1}, second copy
    first = float(nll[:, : half - 1].mean())
    held = _nll(model, held_out)  # (B, T − 1): the loss of predicting token t + 1
    per_pos = held.mean(0)
    q = max(1, per_pos.numel() // 4)
    out = {
        "prefix": prefix,
        "prev": prev,
        "second_copy_loss": second,
        "first_copy_loss": first,
        "icl_score": float(per_pos[-q:].mean() - per_pos[:q].mean()),
        "repeat_loss": None,
        "span_loss": None,
    }
    if copied is not None:
        target_copied = copied[:, 1:]
        out["repeat_loss"] = float(held[target_copied].mean())
        out["span_loss"] = float(held[~target_copied].mean())
    model.train(was)
    return out


def copy_any_loss(rep: Tensor) -> float:
    """The probe's second-copy loss of a model that spreads its guess evenly over the tokens of
    the first copy: the mean over rows of ln(distinct tokens of ``r``)."""
    half = rep.shape[1] // 2
    return sum(math.log(len(set(row))) for row in rep[:, :half].tolist()) / len(rep)


def _probe_data(cfg: InductionConfig, source: TokenSource) -> tuple[Tensor, Tensor, Tensor]:
    """The fixed probe ``[r, r]`` and held-out windows with their copied mask."""
    rep = repeated_tokens(64, cfg.seq_len, source.vocab_size, torch.Generator().manual_seed(10**6))
    gen = torch.Generator().manual_seed(10**6 + 1)
    held, copied = insert_repeats(
        source.sample(64, gen, "val"), gen, min_span=cfg.min_span, max_span=cfg.max_span
    )
    return rep, held, copied


def train_induction(
    model: nn.Module,
    cfg: InductionConfig,
    *,
    steps: int,
    source: TokenSource | None = None,
    deadline: float | None = None,
) -> dict:
    """Train on windows of ``source`` (default: random tokens) with repeats inserted (AdamW,
    constant ``cfg.lr``) and :func:`probe` every ``eval_every`` steps.

    Returns:
        ``{"steps", "seconds", "history": [{"step", "loss", **probe}]}``.
    """
    source = source or TokenSource("random", cfg)
    gen = torch.Generator().manual_seed(cfg.seed)
    rep, held, copied = _probe_data(cfg, source)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    # about 60 measurements; a run stopped by its deadline does not know its length: every 25
    every = cfg.eval_every or (25 if deadline is not None else max(1, steps // 60))
    history, loss_val, step = [], float("nan"), 0
    start = time.perf_counter()
    for step in range(steps + 1):
        stop = step == steps or (deadline is not None and time.perf_counter() > deadline)
        if step % every == 0 or stop:
            history.append({"step": step, "loss": loss_val, **probe(model, rep, held, copied)})
        if stop:
            break
        x, _ = insert_repeats(
            source.sample(cfg.batch_size, gen), gen, min_span=cfg.min_span, max_span=cfg.max_span
        )
        loss = _nll(model, x).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss_val = loss.item()
    return {"steps": step, "seconds": time.perf_counter() - start, "history": history}


def _crossing(series: list[float], steps: list[int], frac: float, rising: bool) -> int | None:
    """The first step where ``series`` has gone ``frac`` of the way from its first to its last
    value."""
    lo, hi = series[0], series[-1]
    level = lo + frac * (hi - lo)
    for s, v in zip(steps, series):
        if (v >= level) if rising else (v <= level):
            return s
    return None


def previous_token_heads(prev: list[float]) -> list[int]:
    """The layer-1 heads that attend to the previous token: a score of at least 0.2 and half
    the best one's (a trained model often spreads the job over several heads)."""
    best = max(prev)
    return [j for j, v in enumerate(prev) if v >= max(0.2, 0.5 * best)] or [prev.index(best)]


def ablations(model: nn.Module, rep: Tensor, prev: list[float], top: int) -> dict:
    """Zero-ablate layer-1 heads with :func:`attnlab.inspect.ablate_heads` and re-measure the
    probe: the previous-token heads (:func:`previous_token_heads` of the scores ``prev``), the
    best of them alone, and as a control the other layer-1 heads.

    Returns:
        ``{"previous-token heads" | "best previous-token head" | "other layer-1 heads":
        {"heads", "prev_score", "prefix_score", "second_copy_loss"}}`` (``prev_score``: the
        ablated heads' best; ``prefix_score``: last-layer head ``top``'s after the ablation).
    """
    chosen = previous_token_heads(prev)
    best = max(range(len(prev)), key=lambda j: prev[j])
    others = [j for j in range(len(prev)) if j not in chosen]
    sets = {"previous-token heads": chosen, "best previous-token head": [best]}
    if others:
        sets["other layer-1 heads"] = others
    out = {}
    for name, heads in sets.items():
        with ablate_heads(model, {"blocks.0.attn": heads}):
            m = probe(model, rep, rep)
        out[name] = {
            "heads": heads,
            "prev_score": max(prev[j] for j in heads),
            "prefix_score": m["prefix"][-1][top],
            "second_copy_loss": m["second_copy_loss"],
        }
    return out


def analyse(res: dict, n_layers: int, cfg: InductionConfig, model: nn.Module, rep: Tensor) -> dict:
    """The induction head (best last-layer prefix score), the layer-1 previous-token head, the
    formation steps (where the score has risen 20/50/80 % of the way, where the second-copy loss
    has fallen so far) and, for ≥ 2 layers, the ablations."""
    h = res["history"]
    last = h[-1]
    n_heads = len(last["prefix"][-1])
    top = max(range(n_heads), key=lambda j: last["prefix"][-1][j])
    steps = [r["step"] for r in h]
    score = [max(r["prefix"][-1]) for r in h]
    loss2 = [r["second_copy_loss"] for r in h]
    jump = [_crossing(score, steps, f, True) for f in (0.2, 0.5, 0.8)]
    drop = [_crossing(loss2, steps, f, False) for f in (0.2, 0.5, 0.8)]
    out = {
        "n_layers": n_layers,
        "induction_head": [n_layers - 1, top],
        "prefix_score": last["prefix"][-1][top],
        "is_induction": last["prefix"][-1][top] >= cfg.threshold,
        "second_copy_loss": last["second_copy_loss"],
        "first_copy_loss": last["first_copy_loss"],
        "repeat_loss": last["repeat_loss"],
        "span_loss": last["span_loss"],
        "icl_score": last["icl_score"],
        "chance": math.log(len(model.lm_head.weight)),
        "copy_any": copy_any_loss(rep),
        "score_jump": jump,
        "loss_drop": drop,
        # steps the score took from 20 % to 80 % of its rise, as a fraction of the run
        "rise_fraction": (jump[2] - jump[0]) / max(1, steps[-1]) if None not in jump else None,
        "ablation": None,
    }
    if n_layers >= 2:
        out["ablation"] = ablations(model, rep, last["prev"][0], top)
    return out


def run_induction(cfg: InductionConfig, out_dir: str | Path, *, overwrite: bool = False) -> dict:
    """Train one attention-only model per depth and setting for the same steps; measure, ablate.

    Returns:
        ``{"config", "runs": [{"setting", "n_layers", "history", ...analyse}], "summary",
        "elapsed"}``.

    Raises:
        RunDirError: ``out_dir`` holds files and ``overwrite`` is not set.
        UserError: a bad setting.
    """
    if not cfg.layers:
        raise UserError("give at least one depth (--layers)")
    common.check_bounds(cfg, BOUNDS)
    if cfg.seq_len < 8 or cfg.seq_len % 2:
        raise UserError(f"seq_len must be even and at least 8, got {cfg.seq_len}")
    if not 0 < cfg.min_span <= cfg.max_span <= 0.5:
        raise UserError(f"need 0 < min_span <= max_span <= 0.5, got {cfg.min_span}, {cfg.max_span}")
    if not cfg.settings:
        raise UserError(f"give at least one setting of {', '.join(SETTINGS)}")
    sources = [TokenSource(s, cfg) for s in cfg.settings]  # checks the names first
    budget = common.Budget(cfg.max_time)
    out = common.prepare_out_dir(out_dir, overwrite=overwrite)
    runs: list[dict] = []
    n_runs = len(cfg.layers) * len(sources)
    for source in sources:
        first = None
        for n in sorted(cfg.layers, reverse=True):  # the deepest first sets the steps
            model = attention_only_lm(cfg, n, source.vocab_size)
            if cfg.steps is not None:
                res = train_induction(model, cfg, steps=cfg.steps, source=source)
            elif first is None:
                share = budget.share(n_runs - len(runs), reserve=0.1 * cfg.max_time)
                share *= len(cfg.layers)  # the deepest's part of its setting's share
                share *= n / sum(cfg.layers)  # (a step costs about its depth)
                res = train_induction(
                    model, cfg, steps=10**7, source=source, deadline=time.perf_counter() + share
                )
            else:
                res = train_induction(model, cfg, steps=first, source=source)
            first = res["steps"] if first is None else first
            task = {"task": "repeated_spans", "setting": source.setting,
                    "vocab_size": source.vocab_size, "seq_len": cfg.seq_len,
                    "min_span": cfg.min_span, "max_span": cfg.max_span}  # fmt: skip
            if source.chars is not None:
                task["chars"] = source.chars
            train = {"optimizer": "adamw", "lr": cfg.lr, "batch_size": cfg.batch_size,
                     "steps": res["steps"]}  # fmt: skip
            save_run(model, out / "runs" / f"{source.setting}-{n}-layer", task, train,
                     res["history"])  # fmt: skip
            rep = _probe_data(cfg, source)[0]
            runs.append({"setting": source.setting, **res, **analyse(res, n, cfg, model, rep)})
            if cfg.progress:
                r = runs[-1]
                print(f"{source.setting} {n}-layer: {r['steps']} steps, prefix "
                      f"{r['prefix_score']:.2f}, 2nd copy {r['second_copy_loss']:.2f}", flush=True)  # fmt: skip
    runs.sort(key=lambda r: (SETTINGS.index(r["setting"]), r["n_layers"]))
    results = {"config": asdict(cfg), "runs": runs}
    results["summary"] = summarise(results)
    notes = (
        f"Attention-only DecoderLMs (d_model {cfg.d_model}, {cfg.n_heads} heads per layer, "
        f"{cfg.position} positions, no MLP), batch {cfg.batch_size}, AdamW at lr {cfg.lr:g}, on "
        f"windows of {cfg.seq_len} tokens in which a span of {cfg.min_span:g}–{cfg.max_span:g} "
        f"of the window repeats to the end. Scores on 64 probe rows [r, r] of random tokens; an "
        f"induction head scores ≥ {cfg.threshold} prefix matching. Copy-any: ln(distinct tokens "
        "of r), the second-copy loss of a model that knows the next token is in the context but "
        "not which. Jump / drop: steps where the best last-layer prefix score has risen, and "
        "the second-copy loss fallen, half-way; rise: the steps from 20 % to 80 % of the "
        "score's rise as a fraction of the run."
    )
    common.write_outputs(
        out,
        "Induction heads: attention-only Transformers of 1 and 2 layers",
        [_table(results), _ablation_table(results)],
        results,
        notes,
        plot=(plot_induction, "induction_heads.png"),
        budget=budget,
    )
    return results


def _table(results: dict) -> common.Table:
    cols = ["setting", "layers", "steps", "best prefix score", "induction head", "loss 2nd copy",
            "loss 1st copy", "copy-any", "ln V", "held-out repeats / rest", "ICL score",
            "score jump at", "loss drop at", "rise"]  # fmt: skip
    fmts = ["", "d", "d", ".2f", "", ".2f", ".2f", ".2f", ".2f", "", ".2f", "", "", ".0%"]
    table = common.Table(cols, formats=fmts)
    for r in results["runs"]:
        where = f"L{r['induction_head'][0] + 1}H{r['induction_head'][1]}"
        held = f"{r['repeat_loss']:.2f} / {r['span_loss']:.2f}" if r["repeat_loss"] else None
        induct = r["is_induction"]
        table.add(
            r["setting"], r["n_layers"], r["steps"], r["prefix_score"], where if induct else "none",
            r["second_copy_loss"], r["first_copy_loss"], r["copy_any"], r["chance"], held,
            r["icl_score"], r["score_jump"][1] if induct else None,
            r["loss_drop"][1] if induct else None, r["rise_fraction"] if induct else None,
        )  # fmt: skip
    return table


def _ablation_table(results: dict) -> common.Table:
    table = common.Table(
        [
            "setting",
            "ablated (deepest model)",
            "head",
            "their best prev-token score",
            "prefix score after",
            "loss 2nd copy after",
        ],  # fmt: skip
        formats=["", "", "", ".2f", ".2f", ".2f"],
    )
    for r in results["runs"]:
        if r["ablation"]:
            table.add(r["setting"], "none", "–", None, r["prefix_score"], r["second_copy_loss"])
            for name, a in r["ablation"].items():
                head = ", ".join(f"L1H{j}" for j in a["heads"])
                table.add(r["setting"], name, head, a["prev_score"], a["prefix_score"],
                          a["second_copy_loss"])  # fmt: skip
    return table


def summarise(results: dict) -> str:
    """One sentence per run: whether it formed an induction head, the second-copy loss; or,
    when a setting's deepest model's second-copy loss is still near ln V, "Undertrained … train
    longer"."""
    cfg = results.get("config") or {}
    deepest = {}
    for r in results["runs"]:
        s = r.get("setting", "random")
        if s not in deepest or r["n_layers"] > deepest[s]["n_layers"]:
            deepest[s] = r
    for s, d in deepest.items():
        short = common.undertrained(  # a model at chance on the copy has learnt no circuit to read
            {f"{s} {d['n_layers']}-layer": d["second_copy_loss"]},
            threshold=d["chance"] - BELOW_CHANCE,
            what="the loss on the second copy (nats; ln V = " + f"{d['chance']:.2f})",
            higher_is_better=False,
            budget=cfg,
            fmt=lambda v: f"{v:.2f}",
        )
        if short is not None:
            return short
    parts = []
    for r in results["runs"]:
        s = (
            f"{r.get('setting', 'random')}, {r['n_layers']} layer(s): best last-layer "
            f"prefix-matching score {r['prefix_score']:.2f}, loss on the second copy "
            f"{r['second_copy_loss']:.2f} nats vs ln V = {r['chance']:.2f}"
        )
        if r["ablation"]:
            a = r["ablation"]["previous-token heads"]
            heads = ", ".join(f"L1H{j}" for j in a["heads"])
            s += (
                f"; ablating the previous-token head(s) {heads} takes the prefix score "
                f"to {a['prefix_score']:.2f} and the second-copy loss to "
                f"{a['second_copy_loss']:.2f}"
            )
        parts.append(s)
    return "; ".join(parts) + "."


def plot_induction(results: dict, path: str | Path) -> None:
    """Per setting (a row), over steps: the best last-layer prefix-matching score, the deepest
    model's layer-1 previous-token score, and the second-copy loss (against ln V)."""
    plt = pyplot()

    settings = list(dict.fromkeys(r.get("setting", "random") for r in results["runs"]))
    fig, axes = plt.subplots(len(settings), 2, figsize=(11, 4.0 * len(settings)), squeeze=False)
    for (ax_s, ax_l), setting in zip(axes, settings):
        runs = [r for r in results["runs"] if r.get("setting", "random") == setting]
        for r, colour in zip(runs, ("C0", "C3", "C2", "C1")):
            steps = [h["step"] for h in r["history"]]
            ax_s.plot(steps, [max(h["prefix"][-1]) for h in r["history"]], color=colour,
                      label=f"{r['n_layers']}-layer: prefix matching")  # fmt: skip
            if r["n_layers"] >= 2:
                ax_s.plot(steps, [max(h["prev"][0]) for h in r["history"]], color=colour,
                          ls=":", label=f"{r['n_layers']}-layer: layer-1 previous-token")  # fmt: skip
            ax_l.plot(steps, [h["second_copy_loss"] for h in r["history"]], color=colour,
                      label=f"{r['n_layers']}-layer: 2nd copy")  # fmt: skip
            ax_l.plot(steps, [h["first_copy_loss"] for h in r["history"]], color=colour,
                      ls="--", label=f"{r['n_layers']}-layer: 1st copy")  # fmt: skip
            if r["ablation"]:
                a = r["ablation"]["previous-token heads"]
                ax_l.plot([steps[-1]], [a["second_copy_loss"]], "x", color=colour, ms=9,
                          label=f"{r['n_layers']}-layer, prev-token head ablated")  # fmt: skip
        ax_l.axhline(runs[0]["chance"], color="grey", lw=1, ls=":")
        ax_l.text(0, runs[0]["chance"], " ln V", va="bottom", color="grey", fontsize=8)
        ax_s.set_ylabel("attention score")
        ax_l.set_ylabel("loss on the probe [r, r] (nats)")
        for ax in (ax_s, ax_l):
            ax.set_xlabel("step")
            ax.legend(fontsize=8)
        ax_s.set_title(f"{setting}: induction head formation")
        ax_l.set_title(f"{setting}: loss on the probe")
    save_png(fig, path)
