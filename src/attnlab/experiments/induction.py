"""Induction heads, measured: attention-only Transformers of 1 and 2 layers trained on random
tokens with repeated spans (Olsson et al. 2022, "In-context Learning and Induction Heads").

Each training sequence is uniform random tokens in which one span (of random length and place)
appears twice; only the second copy is predictable, and only from the context. The claims: a
2-layer model forms an *induction head* — a layer-2 head that attends from a token to the token
right after that token's previous occurrence (prefix matching), fed by a layer-1 head that
attends to the previous token — and so predicts the second copy far below chance (ln V); a
1-layer model cannot (its keys know only their own token); the head forms abruptly, the jump of
its score at the step the loss drops; ablating the previous-token head removes the effect.

Measured over training, on a fixed probe of repeated random tokens ``[r, r]`` (``r`` of
``T/2`` tokens), with Olsson et al.'s definitions:

- prefix-matching score of each head: its mean attention from position ``T/2 + i`` (token
  ``r_i`` again) to position ``i + 1`` (the token after ``r_i``'s first occurrence);
- previous-token score of each layer-1 head: its mean attention from ``t`` to ``t − 1``;
- the loss on the second copy of ``r`` (and on the first), against ``ln V``;
- the in-context-learning score: held-out loss late in the context (last quarter of the
  positions) minus early in it (first quarter), on sequences of the training distribution.

At the end, the 2-layer model's previous-token head (the layer-1 head with the highest
previous-token score) is zero-ablated — its slice of the output projection ``W_O`` zeroed in a
copy — and the probe re-measured; the layer-1 head with the lowest score is ablated as a control.

Outputs: ``table.md``, ``results.json``, ``induction_heads.png`` and ``runs/<n>-layer``.

Shape legend: B batch, T sequence length, H heads, D head dim, V vocab_size.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.experiments import common

__all__ = [
    "InductionConfig",
    "repeated_spans",
    "repeated_tokens",
    "attention_only_lm",
    "probe",
    "ablate_head",
    "train_induction",
    "run_induction",
]

#: the deepest model's second-copy loss must sit this many nats under ln V (chance) before its
#: heads are read (the documented 2-layer run: 2.35 vs ln V 3.47; a few steps stay at ln V)
BELOW_CHANCE = 0.3


@dataclass
class InductionConfig:
    """Settings of the induction-heads experiment.

    Args:
        max_time: seconds for the whole experiment (the runs share it equally).
        steps: train every run for exactly this many steps instead.
        layers: one attention-only model per depth (default 1 and 2).
        vocab_size, seq_len: random tokens and the window T (even: the probe is two halves).
        d_model, n_heads: the model.
        batch_size, lr: AdamW at a constant rate.
        eval_every: steps between measurements (None: about 40 over a run of ``steps``, every
            15 steps for one fitted into the budget).
        position: the position scheme (Olsson et al.'s small models: learned).
        max_span: the longest repeated span, as a fraction of T.
        threshold: the prefix-matching score above which a head counts as an induction head.
        device, seed, progress: as for training.
    """

    max_time: float = 120.0
    steps: int | None = None
    layers: tuple[int, ...] = (1, 2)
    vocab_size: int = 32
    seq_len: int = 32
    d_model: int = 64
    n_heads: int = 2
    batch_size: int = 32
    lr: float = 3e-3
    eval_every: int | None = None
    threshold: float = 0.3
    position: str = "learned"
    max_span: float = 0.5
    device: str = "cpu"
    seed: int = 0
    progress: bool = True


def repeated_spans(
    batch: int, seq_len: int, vocab: int, gen: torch.Generator, *, max_span: float = 0.25
) -> Tensor:
    """``(B, T)`` uniform random tokens, each row with one span copied to a later place.

    The span's length is uniform in ``T/8 … max_span·T``, its first copy starts anywhere, its second
    anywhere after the first ends, so the offset between the copies varies from the span's
    length to nearly T: no fixed offset (a position shortcut) predicts the second copy.
    """
    x = torch.randint(vocab, (batch, seq_len), generator=gen)
    lo = max(2, seq_len // 8)
    hi = max(lo, int(max_span * seq_len))
    for row in x:
        n = int(torch.randint(lo, hi + 1, (1,), generator=gen))
        a = int(torch.randint(0, seq_len - 2 * n + 1, (1,), generator=gen))
        b = int(torch.randint(a + n, seq_len - n + 1, (1,), generator=gen))
        row[b : b + n] = row[a : a + n]
    return x


def repeated_tokens(batch: int, seq_len: int, vocab: int, gen: torch.Generator) -> Tensor:
    """The probe: ``(B, T)`` rows ``[r, r]``, ``r`` of ``T/2`` uniform random tokens."""
    r = torch.randint(vocab, (batch, seq_len // 2), generator=gen)
    return torch.cat([r, r], dim=1)


def attention_only_lm(cfg: InductionConfig, n_layers: int) -> nn.Module:
    """An attention-only :class:`DecoderLM` (``ffn="none"``, learned positions, untied
    unembedding) of ``n_layers`` layers, initialised under ``cfg.seed``."""
    from attnlab.config.lm import ModelConfig
    from attnlab.models.lm import DecoderLM

    mcfg = ModelConfig.preset(
        "tiny",
        vocab_size=cfg.vocab_size,
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


def ablate_head(model: nn.Module, layer: int, head: int) -> nn.Module:
    """A copy of ``model`` with head ``head`` of block ``layer`` zero-ablated: its columns of
    the output projection ``W_O`` (``out_proj.weight[:, h·D:(h+1)·D]``) set to 0."""
    m = copy.deepcopy(model)
    attn = m.blocks[layer].attn
    d = attn.out_proj.weight.shape[1] // attn.n_heads
    with torch.no_grad():
        attn.out_proj.weight[:, head * d : (head + 1) * d] = 0
    return m


@torch.no_grad()
def probe(model: nn.Module, rep: Tensor, held_out: Tensor) -> dict:
    """Olsson et al.'s measurements of ``model`` on the probe ``rep`` ``[r, r]`` and on
    ``held_out`` sequences of the training distribution.

    Returns:
        ``{"prefix": [[score per head] per layer], "prev": [[...] per layer], "second_copy_loss",
        "first_copy_loss", "icl_score"}``.
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
    lg = model(held_out[:, :-1])
    per_pos = F.cross_entropy(lg.transpose(1, 2).float(), held_out[:, 1:], reduction="none").mean(0)
    q = max(1, per_pos.numel() // 4)
    model.train(was)
    return {
        "prefix": prefix,
        "prev": prev,
        "second_copy_loss": second,
        "first_copy_loss": first,
        "icl_score": float(per_pos[-q:].mean() - per_pos[:q].mean()),
    }


def train_induction(
    model: nn.Module,
    cfg: InductionConfig,
    *,
    steps: int,
    deadline: float | None = None,
) -> dict:
    """Train on :func:`repeated_spans` batches (AdamW, constant ``cfg.lr``) and :func:`probe`
    every ``eval_every`` steps.

    Returns:
        ``{"steps", "seconds", "history": [{"step", "loss", **probe}]}``.
    """
    gen = torch.Generator().manual_seed(cfg.seed)
    rep = repeated_tokens(64, cfg.seq_len, cfg.vocab_size, torch.Generator().manual_seed(10**6))
    held = repeated_spans(
        64,
        cfg.seq_len,
        cfg.vocab_size,
        torch.Generator().manual_seed(10**6 + 1),
        max_span=cfg.max_span,
    )
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    # about 40 measurements; a run stopped by its deadline does not know its length: every 15
    every = cfg.eval_every or (15 if deadline is not None else max(1, steps // 40))
    history, loss_val, step = [], float("nan"), 0
    start = time.perf_counter()
    for step in range(steps + 1):
        stop = step == steps or (deadline is not None and time.perf_counter() > deadline)
        if step % every == 0 or stop:
            history.append({"step": step, "loss": loss_val, **probe(model, rep, held)})
        if stop:
            break
        x = repeated_spans(cfg.batch_size, cfg.seq_len, cfg.vocab_size, gen, max_span=cfg.max_span)
        loss = F.cross_entropy(model(x[:, :-1]).transpose(1, 2), x[:, 1:])
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


def analyse(res: dict, n_layers: int, cfg: InductionConfig, model: nn.Module) -> dict:
    """The induction head (best last-layer prefix score), the layer-1 previous-token head, the
    formation steps and, for ≥ 2 layers, the ablations."""
    h = res["history"]
    last = h[-1]
    top = max(range(cfg.n_heads), key=lambda j: last["prefix"][-1][j])
    steps = [r["step"] for r in h]
    score = [max(r["prefix"][-1]) for r in h]
    loss2 = [r["second_copy_loss"] for r in h]
    out = {
        "n_layers": n_layers,
        "induction_head": [n_layers - 1, top],
        "prefix_score": last["prefix"][-1][top],
        "is_induction": last["prefix"][-1][top] >= cfg.threshold,
        "second_copy_loss": last["second_copy_loss"],
        "first_copy_loss": last["first_copy_loss"],
        "icl_score": last["icl_score"],
        "chance": math.log(cfg.vocab_size),
        "score_jump": [_crossing(score, steps, f, True) for f in (0.2, 0.5, 0.8)],
        "loss_drop": [_crossing(loss2, steps, f, False) for f in (0.2, 0.5, 0.8)],
        "ablation": None,
    }
    if n_layers >= 2:
        prev = last["prev"][0]
        ph = max(range(cfg.n_heads), key=lambda j: prev[j])
        control = min(range(cfg.n_heads), key=lambda j: prev[j])
        gen = torch.Generator().manual_seed(10**6)
        rep = repeated_tokens(64, cfg.seq_len, cfg.vocab_size, gen)
        held = repeated_spans(64, cfg.seq_len, cfg.vocab_size, gen, max_span=cfg.max_span)
        abl = {}
        for name, head in (("previous-token head", ph), ("control head", control)):
            m = probe(ablate_head(model, 0, head), rep, held)
            abl[name] = {
                "head": [0, head],
                "prev_score": prev[head],
                "prefix_score": m["prefix"][-1][top],
                "second_copy_loss": m["second_copy_loss"],
            }
        out["ablation"] = abl
    return out


def run_induction(cfg: InductionConfig, out_dir: str | Path, *, overwrite: bool = False) -> dict:
    """Train one attention-only model per depth for the same steps; measure and ablate.

    Returns:
        ``{"config", "runs": [{"n_layers", "history", ...analyse}], "summary", "elapsed"}``.

    Raises:
        RunDirError: ``out_dir`` holds files and ``overwrite`` is not set.
        UserError: a bad setting.
    """
    from attnlab.errors import UserError
    from attnlab.experiments.grokking import save_run

    if not cfg.layers or min(cfg.layers) < 1:
        raise UserError(f"layers must be positive depths, got {cfg.layers}")
    if cfg.seq_len < 8 or cfg.seq_len % 2:
        raise UserError(f"seq_len must be even and at least 8, got {cfg.seq_len}")
    budget = common.Budget(cfg.max_time)
    out = common.prepare_out_dir(out_dir, overwrite=overwrite)
    runs: list[dict] = []
    for i, n in enumerate(sorted(cfg.layers, reverse=True)):  # the deepest first sets the steps
        model = attention_only_lm(cfg, n)
        if cfg.steps is not None:
            res = train_induction(model, cfg, steps=cfg.steps)
        elif i == 0:
            share = budget.share(len(cfg.layers), reserve=0.1 * cfg.max_time)
            res = train_induction(model, cfg, steps=10**7, deadline=time.perf_counter() + share)
        else:
            res = train_induction(model, cfg, steps=runs[0]["steps"])
        task = {"task": "repeated_spans", "vocab_size": cfg.vocab_size, "seq_len": cfg.seq_len}
        train = {"optimizer": "adamw", "lr": cfg.lr, "batch_size": cfg.batch_size}
        train["steps"] = res["steps"]
        save_run(model, out / "runs" / f"{n}-layer", task, train, res["history"])
        runs.append({**res, **analyse(res, n, cfg, model)})
    runs.sort(key=lambda r: r["n_layers"])
    results = {"config": asdict(cfg), "runs": runs}
    results["summary"] = summarise(results)
    notes = (
        f"Attention-only DecoderLMs (d_model {cfg.d_model}, {cfg.n_heads} heads per layer, "
        f"learned positions, no MLP), {runs[0]['steps']} steps of batch {cfg.batch_size} at lr "
        f"{cfg.lr:g} on windows of {cfg.seq_len} random tokens (V = {cfg.vocab_size}, chance "
        f"ln V = {math.log(cfg.vocab_size):.2f}) with one repeated span each. Scores on 64 "
        f"probe rows [r, r]; an induction head scores ≥ {cfg.threshold} prefix matching."
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
    cols = ["layers", "steps", "best prefix score", "induction head", "loss 2nd copy",
            "loss 1st copy", "ln V", "ICL score", "score jump at", "loss drop at"]  # fmt: skip
    fmts = ["d", "d", ".2f", "", ".2f", ".2f", ".2f", ".2f", "", ""]
    table = common.Table(cols, formats=fmts)
    for r in results["runs"]:
        where = f"L{r['induction_head'][0] + 1}H{r['induction_head'][1]}"
        table.add(
            r["n_layers"], r["steps"], r["prefix_score"], where if r["is_induction"] else "none",
            r["second_copy_loss"], r["first_copy_loss"], r["chance"], r["icl_score"],
            r["score_jump"][1], r["loss_drop"][1],
        )  # fmt: skip
    return table


def _ablation_table(results: dict) -> common.Table:
    table = common.Table(
        [
            "ablated (2-layer model)",
            "head",
            "its prev-token score",
            "prefix score after",
            "loss 2nd copy after",
        ],  # fmt: skip
        formats=["", "", ".2f", ".2f", ".2f"],
    )
    for r in results["runs"]:
        if r["ablation"]:
            table.add("none", "–", None, r["prefix_score"], r["second_copy_loss"])
            for name, a in r["ablation"].items():
                head = f"L1H{a['head'][1]}"
                table.add(name, head, a["prev_score"], a["prefix_score"], a["second_copy_loss"])
    return table


def summarise(results: dict) -> str:
    """One sentence per depth: whether it formed an induction head, the second-copy loss; or,
    when the deepest model's second-copy loss is still near ln V, "Undertrained … train longer"."""
    cfg = results.get("config") or {}
    deepest = max(results["runs"], key=lambda r: r["n_layers"])
    short = common.undertrained(  # a model at chance on the copy has learnt no circuit to read
        {f"{deepest['n_layers']}-layer": deepest["second_copy_loss"]},
        threshold=deepest["chance"] - BELOW_CHANCE,
        what="the loss on the second copy (nats; ln V = " + f"{deepest['chance']:.2f})",
        higher_is_better=False,
        max_time=None if cfg.get("steps") else cfg.get("max_time"),
        steps=cfg.get("steps"),
        fmt=lambda v: f"{v:.2f}",
    )
    if short is not None:
        return short
    parts = []
    for r in results["runs"]:
        s = (
            f"{r['n_layers']} layer(s): best last-layer prefix-matching score "
            f"{r['prefix_score']:.2f}, loss on the second copy {r['second_copy_loss']:.2f} "
            f"nats vs ln V = {r['chance']:.2f}"
        )
        if r["ablation"]:
            a = r["ablation"]["previous-token head"]
            s += (
                f"; ablating the previous-token head L1H{a['head'][1]} takes the prefix score "
                f"to {a['prefix_score']:.2f} and the second-copy loss to "
                f"{a['second_copy_loss']:.2f}"
            )
        parts.append(s)
    return "; ".join(parts) + "."


def plot_induction(results: dict, path: str | Path) -> None:
    """Per depth, over steps: the best last-layer prefix-matching score and the second-copy
    loss (against ln V)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attnlab.fileio import atomic_save

    fig, (ax_s, ax_l) = plt.subplots(1, 2, figsize=(11, 4.2))
    for r, colour in zip(results["runs"], ("C0", "C3", "C2", "C1")):
        steps = [h["step"] for h in r["history"]]
        ax_s.plot(steps, [max(h["prefix"][-1]) for h in r["history"]], color=colour,
                  label=f"{r['n_layers']}-layer: prefix matching")  # fmt: skip
        if r["n_layers"] >= 2:
            ax_s.plot(steps, [max(h["prev"][0]) for h in r["history"]], color=colour, ls=":",
                      label=f"{r['n_layers']}-layer: layer-1 previous-token")  # fmt: skip
        ax_l.plot(steps, [h["second_copy_loss"] for h in r["history"]], color=colour,
                  label=f"{r['n_layers']}-layer: 2nd copy")  # fmt: skip
        ax_l.plot(steps, [h["first_copy_loss"] for h in r["history"]], color=colour, ls="--",
                  label=f"{r['n_layers']}-layer: 1st copy")  # fmt: skip
    ax_l.axhline(results["runs"][0]["chance"], color="grey", lw=1, ls=":")
    ax_l.text(0, results["runs"][0]["chance"], " ln V", va="bottom", color="grey", fontsize=8)
    ax_s.set_ylabel("attention score")
    ax_l.set_ylabel("loss on the probe [r, r] (nats)")
    for ax in (ax_s, ax_l):
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    ax_s.set_title("induction head formation")
    fig.tight_layout()
    atomic_save(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
