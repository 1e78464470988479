"""The lecture's ablations, measured: take one part out of a small character-level LM and see
what it was doing.

Every row trains two (or more) variants of a tiny ``DecoderLM`` on character-level ``pydoc``
from the same seed, for the same steps, with the same batches, and reads what the part is
said to do:

- ``causal``: the causal mask removed. The maskless model (:class:`EncoderMLM`'s stack, the same
  pre-norm blocks with ``is_causal=False``, trained on next-token targets) reads the token it
  must predict at the next position, so its teacher-forced loss collapses towards 0; when it
  generates, the next token is not there yet, so its loss predicting the last position of a
  prefix (the only position generation uses) is far worse than the causal model's.
- ``heads``: one head against several at equal width (``n_heads`` 1 vs 4 at one d_model, the
  same parameters): the validation loss.
- ``moe``: a mixture-of-experts FFN with and without the load-balancing loss (``moe_aux_coef``
  0.01 vs 0): each expert's share of the routing assignments on held-out text (uniform is
  1/E), the largest share, and the dead experts (under a tenth of the uniform share).
- ``qk-norm``: at a high learning rate (``high_lr``), without and with QK-norm (RMSNorm of q
  and k per head): gradient spikes (a global gradient norm over 5× the median of the 20 steps
  before), the largest norm, the validation loss.
- ``clipping``: at the same high rate, without and with clipping the global gradient norm at 1.
- ``batchnorm``: LayerNorm against BatchNorm (``norm="batchnorm"``: each feature normalised over
  batch × time) in every block: the validation loss (BatchNorm with its running statistics), and,
  with the batch statistics training uses (:func:`batch_dependence`), the largest change of one
  window's logits when the other windows of the batch are replaced, when padding is appended to
  every window, and at the first half of the positions when the second half is replaced.
- ``residual``: ``deep_layers`` blocks with and without the skip connections (``residual``):
  the validation loss and the gradient norm of each block's parameters (:func:`block_grad_norms`)
  at initialisation and after training.
- ``positions-concat``: learned positions added to a d-wide token embedding against a
  ``pos_width``-wide learned position code concatenated to the first d − p channels of the token
  embedding (:class:`ConcatPositions`), at the same width d: the validation loss.

Outputs: ``table.md``, ``results.json``, ``ablations.png``.

Shape legend: B batch, T window, V vocab (characters), E experts, C d_model, P ``pos_width``.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.attention.capture import collect_aux_losses
from attnlab.config.encoder import EncoderConfig
from attnlab.config.lm import ModelConfig
from attnlab.errors import UserError
from attnlab.experiments import common, tiny_lm
from attnlab.experiments.ablation_probes import (
    ConcatPositions,
    batch_dependence,
    block_grad_norms,
    dependence_table,
    grad_table,
)
from attnlab.experiments.induction import InductionConfig, TokenSource
from attnlab.experiments.lm_runs import undertrained_lm
from attnlab.experiments.tiny_lm import TinyLMSettings
from attnlab.models.encoder import EncoderMLM
from attnlab.models.lm import DecoderLM
from attnlab.plotting import pyplot, save_png

__all__ = [
    "ROWS",
    "AblationsConfig",
    "lm_variant",
    "unmasked_lm",
    "train_variant",
    "prefix_loss",
    "expert_load",
    "spikes",
    "concat_positions_lm",
    "run_ablations",
]

#: the rows of the experiment, in table order
ROWS = ("causal", "heads", "moe", "qk-norm", "clipping", "batchnorm", "residual",
        "positions-concat")  # fmt: skip

#: an expert routed under this fraction of the uniform share 1/E is dead
DEAD_SHARE = 0.1

#: a gradient spike: a norm this many times the median of the 20 steps before it
SPIKE_FACTOR = 5.0

#: the settings' ranges (a CPU experiment: larger values are mistakes, refused before building)
BOUNDS = {
    **tiny_lm.BOUNDS, "seq_len": (10, 4096), "n_layers": (1, 48), "n_experts": (1, 256),
    "top_k": (1, 256), "high_lr": (1e-12, 10.0), "deep_layers": (1, 48), "pos_width": (1, 4096),
}  # fmt: skip


@dataclass
class AblationsConfig(TinyLMSettings):
    """Settings of the ablations experiment (and those of :class:`TinyLMSettings`).

    Args:
        rows: which rows (see :data:`ROWS`).
        seq_len, d_model, n_layers, n_heads: the tiny LM (``heads`` compares 1 and ``n_heads``).
        n_experts, top_k: the ``moe`` row's FFN.
        batch_size, lr: AdamW at a constant rate.
        high_lr: the rate of the ``qk-norm`` and ``clipping`` rows (high enough for spikes).
        position: every variant's positions (``rope``: the maskless model finds the next
            token, one step ahead, as quickly as the causal one finds the current one), except
            the ``positions-concat`` row's (learned).
        deep_layers: the depth of the ``residual`` row.
        pos_width: P, the width of the concatenated position code (``positions-concat``;
            None: ``d_model // 4``).
    """

    rows: tuple[str, ...] = ROWS
    seq_len: int = 64
    d_model: int = 64
    n_layers: int = 2
    n_experts: int = 8
    top_k: int = 2
    lr: float = 3e-3
    high_lr: float = 3e-2
    deep_layers: int = 8
    pos_width: int | None = None


def lm_variant(cfg: AblationsConfig, vocab_size: int, **overrides) -> nn.Module:
    """The tiny pre-norm ``DecoderLM`` of ``cfg`` with block ``overrides``, seeded."""
    fields = dict(vocab_size=vocab_size, max_seq_len=cfg.seq_len, d_model=cfg.d_model,
                  n_layers=cfg.n_layers, n_heads=cfg.n_heads, position=cfg.position,
                  dropout=0.0)  # fmt: skip
    torch.manual_seed(cfg.seed)
    return DecoderLM(ModelConfig.preset("tiny", **{**fields, **overrides}))


def unmasked_lm(cfg: AblationsConfig, vocab_size: int) -> nn.Module:
    """The same blocks without the causal mask: an :class:`EncoderMLM` (pre-norm, GELU-tanh,
    ``cfg.position``, no embedding norm: the ``DecoderLM``'s choices), seeded."""
    torch.manual_seed(cfg.seed)
    ecfg = EncoderConfig(
        vocab_size=vocab_size, max_seq_len=cfg.seq_len, d_model=cfg.d_model,
        n_layers=cfg.n_layers, n_heads=cfg.n_heads, norm_position="pre", norm_eps=1e-5,
        activation="gelu_tanh", embed_norm=False, dropout=0.0, position=cfg.position,
    )  # fmt: skip
    return EncoderMLM(ecfg)


def _pos_width(cfg: AblationsConfig) -> int:
    return cfg.pos_width if cfg.pos_width is not None else max(1, cfg.d_model // 4)


def concat_positions_lm(cfg: AblationsConfig, vocab_size: int) -> nn.Module:
    """The tiny ``DecoderLM`` of ``cfg`` with learned positions, its position module replaced by
    a :class:`ConcatPositions` of width ``cfg.pos_width``, seeded."""
    model = lm_variant(cfg, vocab_size, position="learned")
    model.pos_emb = ConcatPositions(cfg.seq_len, cfg.d_model, _pos_width(cfg))
    return model


def _logits(model: nn.Module, x: Tensor) -> Tensor:
    return model(x)  # DecoderLM and EncoderMLM both map (B, T) ids to (B, T, V) logits


def train_variant(
    model: nn.Module,
    source: TokenSource,
    cfg: AblationsConfig,
    *,
    steps: int,
    aux_coef: float = 0.0,
    lr: float | None = None,
    clip: float | None = None,
    deadline: float | None = None,
) -> dict:
    """Next-token training on windows of ``source`` (AdamW at a constant ``lr``, default
    ``cfg.lr``), the MoE load-balancing loss added with ``aux_coef``, the global gradient norm
    clipped to ``clip`` (None: not); the same batches for every variant.

    Returns:
        ``{"steps", "seconds", "history": [{"step", "loss"}], "grad_norms": [per step, before
        clipping], "losses": [per step]}``.
    """
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr or cfg.lr, weight_decay=0.0)
    history, norms, losses, step = [], [], [], 0
    start = time.perf_counter()
    for step in range(steps):
        if deadline is not None and time.perf_counter() > deadline:
            break
        x = source.sample(cfg.batch_size, gen)
        with collect_aux_losses() as aux:
            logits = _logits(model, x[:, :-1])
        ce = F.cross_entropy(logits.transpose(1, 2), x[:, 1:])
        loss = ce + aux_coef * aux.total()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), clip if clip else math.inf)
        opt.step()
        norms.append(float(norm))
        losses.append(ce.item())
        if step % 10 == 0:
            history.append({"step": step, "loss": losses[-1]})
        if not math.isfinite(losses[-1]):
            break
    else:
        step = steps
    return {"steps": step, "seconds": time.perf_counter() - start, "history": history,
            "grad_norms": norms, "losses": losses}  # fmt: skip


def spikes(norms: list[float], factor: float = SPIKE_FACTOR) -> int:
    """Steps whose gradient norm exceeds ``factor`` × the median of the 20 steps before
    (the first 20 steps, where the norm settles from initialisation, are not counted)."""
    count = 0
    for i in range(20, len(norms)):
        window = sorted(norms[i - 20 : i])
        if not math.isfinite(norms[i]) or norms[i] > factor * window[10]:
            count += 1
    return count


@torch.no_grad()
def teacher_forced_loss(model: nn.Module, x: Tensor) -> float:
    """Mean next-token loss over every position of ``x`` ``(B, T)``, the whole row visible."""
    model.eval()
    logits = _logits(model, x[:, :-1])
    return float(F.cross_entropy(logits.transpose(1, 2), x[:, 1:]))


@torch.no_grad()
def prefix_loss(model: nn.Module, x: Tensor, lengths: tuple[int, ...]) -> float:
    """The loss as generation meets it: for each prefix length ℓ, the model reads ``x[:, :ℓ]``
    only and predicts ``x[:, ℓ]`` at its last position; the mean over ``lengths``."""
    model.eval()
    losses = [F.cross_entropy(_logits(model, x[:, :n])[:, -1], x[:, n]) for n in lengths]
    return float(torch.stack(losses).mean())


@torch.no_grad()
def expert_load(model: nn.Module, x: Tensor) -> list[list[float]]:
    """Each MoE layer's share of the routing assignments per expert on ``x`` (sums to 1)."""
    model.eval()
    with collect_aux_losses() as aux:
        _logits(model, x)
    return [(c.float() / c.sum()).tolist() for c in aux.expert_counts]


def _load_summary(load: list[list[float]]) -> dict:
    E = len(load[0])
    flat = [s for layer in load for s in layer]
    return {
        "max_share": max(flat),
        "dead": sum(s < DEAD_SHARE / E for s in flat),
        "experts": len(flat),
        "uniform": 1 / E,
    }


def _variants(row: str, cfg: AblationsConfig, vocab: int) -> list[tuple[str, nn.Module, dict]]:
    """``(name, model, training options)`` of each variant of ``row``."""
    if row == "causal":
        return [("causal mask", lm_variant(cfg, vocab), {}),
                ("no mask", unmasked_lm(cfg, vocab), {})]  # fmt: skip
    if row == "heads":
        return [(f"{h} head{'s' * (h > 1)}", lm_variant(cfg, vocab, n_heads=h), {})
                for h in sorted({1, cfg.n_heads})]  # fmt: skip
    if row == "moe":
        moe = dict(ffn="moe", n_experts=cfg.n_experts, top_k=cfg.top_k, activation="silu")
        return [("load balancing 0.01", lm_variant(cfg, vocab, **moe), {"aux_coef": 0.01}),
                ("no load balancing", lm_variant(cfg, vocab, **moe), {"aux_coef": 0.0})]  # fmt: skip
    if row == "batchnorm":
        return [("LayerNorm", lm_variant(cfg, vocab), {}),
                ("BatchNorm", lm_variant(cfg, vocab, norm="batchnorm"), {})]  # fmt: skip
    if row == "residual":
        deep = {"n_layers": cfg.deep_layers}
        return [("residual", lm_variant(cfg, vocab, **deep), {}),
                ("no residual", lm_variant(cfg, vocab, residual=False, **deep), {})]  # fmt: skip
    if row == "positions-concat":
        return [("added (learned, width d)", lm_variant(cfg, vocab, position="learned"), {}),
                (f"concatenated (learned, width {_pos_width(cfg)})",
                 concat_positions_lm(cfg, vocab), {})]  # fmt: skip
    high = {"lr": cfg.high_lr}
    if row == "qk-norm":
        return [("no QK-norm", lm_variant(cfg, vocab), high),
                ("QK-norm (RMSNorm)", lm_variant(cfg, vocab, qk_norm="rmsnorm"), high)]  # fmt: skip
    return [("no clipping", lm_variant(cfg, vocab), high),
            ("clip at 1.0", lm_variant(cfg, vocab), {**high, "clip": 1.0})]  # fmt: skip


def run_ablations(cfg: AblationsConfig, out_dir: str | Path, *, overwrite: bool = False) -> dict:
    """Train every row's variants for the same steps and measure each row's quantity.

    Returns:
        ``{"config", "rows": {row: [{"variant", "steps", "val_loss", ...}]}, "summary",
        "elapsed"}``.

    Raises:
        RunDirError: ``out_dir`` holds files and ``overwrite`` is not set.
        UserError: an unknown row.
    """
    common.check_bounds(cfg, BOUNDS)
    bad = [r for r in cfg.rows if r not in ROWS]
    if bad or not cfg.rows:
        raise UserError(f"unknown rows {bad or cfg.rows}; choose from {', '.join(ROWS)}")
    source = TokenSource("pydoc", InductionConfig(seq_len=cfg.seq_len, max_chars=cfg.max_chars))
    val = source.sample(64, torch.Generator().manual_seed(10**6), "val")
    lengths = tuple(range(8, cfg.seq_len, max(1, cfg.seq_len // 8)))
    budget = common.Budget(cfg.max_time)
    out = common.prepare_out_dir(out_dir, overwrite=overwrite)
    n_runs = sum(len(_variants(r, cfg, source.vocab_size)) for r in cfg.rows)
    done, rows = 0, {}
    probe = source.sample(cfg.batch_size, torch.Generator().manual_seed(10**6 + 1), "val")
    for row in cfg.rows:
        rows[row], steps = [], cfg.steps
        for name, model, opts in _variants(row, cfg, source.vocab_size):
            init_grads = block_grad_norms(model, probe) if row == "residual" else None
            if steps is None:  # the row's first variant sets its steps within its share
                share = budget.share(n_runs - done, reserve=0.1 * cfg.max_time)
                res = train_variant(model, source, cfg, steps=10**7,
                                    deadline=time.perf_counter() + share, **opts)  # fmt: skip
                steps = res["steps"]
            else:
                res = train_variant(model, source, cfg, steps=steps, **opts)
            done += 1
            r = {"variant": name, "steps": res["steps"], "seconds": res["seconds"],
                 "val_loss": teacher_forced_loss(model, val), "history": res["history"],
                 "parameters": sum(p.numel() for p in model.parameters())}  # fmt: skip
            if row == "causal":
                r["generation_loss"] = prefix_loss(model, val, lengths)
            if row == "moe":
                r["load"] = expert_load(model, val)
                r.update(_load_summary(r["load"]))
            if row == "batchnorm":  # after the val loss: the probes run in training mode
                r["dependence"] = batch_dependence(model, val[:32])
                r["dependence_eval"] = batch_dependence(model, val[:32], training=False)
            if row == "residual":
                r.update(grads_init=init_grads, grads_trained=block_grad_norms(model, probe))
            if row in ("qk-norm", "clipping"):
                finite = [v for v in res["losses"] if math.isfinite(v)]
                r.update(lr=opts["lr"], spikes=spikes(res["grad_norms"]),
                         max_grad_norm=max(res["grad_norms"]), highest_loss=max(finite),
                         grad_norms=res["grad_norms"])  # fmt: skip
            rows[row].append(r)
            if cfg.progress:
                print(f"{row} / {name}: {r['steps']} steps, val loss {r['val_loss']:.3f}",
                      flush=True)  # fmt: skip
    results = {"config": asdict(cfg), "vocab_size": source.vocab_size, "rows": rows}
    results["summary"] = summarise(results)
    notes = (
        f"Tiny pre-norm DecoderLMs (d_model {cfg.d_model}, {cfg.n_layers} layers) on pydoc by "
        f"characters (V = {source.vocab_size}, ln V = {math.log(source.vocab_size):.2f}), windows "
        f"of {cfg.seq_len}, batch {cfg.batch_size}, AdamW at lr {cfg.lr:g}; the variants of a "
        "row share seed, batches and steps. Val loss: teacher-forced, the whole window "
        "visible. Generation loss: the model reads a prefix only and predicts the next "
        f"character at its last position (prefix lengths {lengths[0]}…{lengths[-1]}). Expert "
        f"load: shares of the top-{cfg.top_k} routing assignments on held-out windows; dead: "
        f"under {DEAD_SHARE:g}/E."
    )
    if "batchnorm" in rows:
        notes += (
            " Batch dependence (batchnorm row): the largest change of a window's logits when the "
            "other windows of its batch (16) are replaced, when every window gets "
            f"{cfg.seq_len // 2} padding tokens appended after its first "
            f"{cfg.seq_len - cfg.seq_len // 2} characters, and at the first half of the positions "
            "when the second half of every window is replaced; with the batch statistics of "
            "training mode, and in evaluation mode (running statistics)."
        )
    if "residual" in rows:
        notes += (
            f" Gradient norms (residual row, {cfg.deep_layers} layers): each block's parameters, "
            f"one held-out batch of {cfg.batch_size}, at initialisation and after training."
        )
    tables = [_table(results)]
    tables += [dependence_table(rows["batchnorm"])] if "batchnorm" in rows else []
    tables += [grad_table(rows["residual"])] if "residual" in rows else []
    common.write_outputs(out, "Ablations: one part taken out", tables, results, notes,
                         plot=(plot_ablations, "ablations.png"), budget=budget)  # fmt: skip
    return results


def _table(results: dict) -> common.Table:
    table = common.Table(
        [
            "row",
            "variant",
            "parameters",
            "steps",
            "val loss",
            "generation loss",
            "largest expert share",
            "dead experts",
            "lr",
            "grad spikes",
            "max grad norm",
            "highest loss",
        ],
        formats=["", "", "d", "d", ".3f", ".3f", ".1%", "", "g", "", ".1f", ".2f"],
    )
    for row, variants in results["rows"].items():
        for r in variants:
            dead = f"{r['dead']} of {r['experts']}" if "dead" in r else None
            table.add(row, r["variant"], r["parameters"], r["steps"], r["val_loss"],
                      r.get("generation_loss"), r.get("max_share"), dead, r.get("lr"),
                      r.get("spikes"), r.get("max_grad_norm"), r.get("highest_loss"))  # fmt: skip
    return table


def summarise(results: dict) -> str:
    """One sentence per row; or, when no causal model has learnt past the unigram level (its
    best val loss not 1 nat under ln V), "Undertrained … train longer"."""
    rows, parts = results["rows"], []
    causal = [r["val_loss"] for name, vs in rows.items() if name != "causal" for r in vs]
    causal += [rows["causal"][0]["val_loss"]] if "causal" in rows else []
    short = undertrained_lm(
        {**results, "data": {"vocab_size": results["vocab_size"]}},
        min(causal, default=None),
        "the best causal variant's validation loss",
    )
    if short is not None:
        return short
    if "causal" in rows:
        c, n = rows["causal"]
        parts.append(
            f"Without the causal mask the teacher-forced loss is {n['val_loss']:.2f} (causal "
            f"{c['val_loss']:.2f}); where generation reads it, at the last position of a "
            f"prefix, {n['generation_loss']:.2f} (causal {c['generation_loss']:.2f})."
        )
    if "heads" in rows:
        parts.append(
            "Equal width: "
            + ", ".join(f"{r['variant']} val loss {r['val_loss']:.3f}" for r in rows["heads"])
            + "."
        )
    if "moe" in rows:
        parts.append(
            "MoE: "
            + "; ".join(
                f"{r['variant']}: largest expert share {r['max_share']:.0%} (uniform "
                f"{r['uniform']:.0%}), {r['dead']} of {r['experts']} experts dead"
                for r in rows["moe"]
            )
            + "."
        )
    for row in ("qk-norm", "clipping"):
        if row in rows:
            parts.append(
                f"At lr {rows[row][0]['lr']:g}: "
                + "; ".join(
                    f"{r['variant']}: {r['spikes']} gradient spikes, max norm "
                    f"{r['max_grad_norm']:.1f}, val loss {r['val_loss']:.3f}"
                    for r in rows[row]
                )
                + "."
            )
    if "batchnorm" in rows:
        parts.append(
            "With batch statistics, replacing the other windows of the batch changes a window's "
            "logits by up to "
            + ", ".join(
                f"{r['dependence']['batch']:.2g} ({r['variant']})" for r in rows["batchnorm"]
            )
            + "; val loss "
            + ", ".join(f"{r['val_loss']:.3f} ({r['variant']})" for r in rows["batchnorm"])
            + "."
        )
    if "residual" in rows:
        parts.append(
            f"{len(rows['residual'][0]['grads_init'])} layers, the first block's gradient "
            "norm at initialisation / after training: "
            + ", ".join(
                f"{r['grads_init'][0]:.2g} / {r['grads_trained'][0]:.2g} ({r['variant']})"
                for r in rows["residual"]
            )
            + "; val loss "
            + ", ".join(f"{r['val_loss']:.3f} ({r['variant']})" for r in rows["residual"])
            + "."
        )
    if "positions-concat" in rows:
        parts.append(
            "Positions: "
            + ", ".join(
                f"{r['variant']} val loss {r['val_loss']:.3f}" for r in rows["positions-concat"]
            )
            + "."
        )
    return " ".join(parts)


def plot_ablations(results: dict, path: str | Path) -> None:
    """Training loss of every variant, one panel per row; the MoE row's expert loads."""
    plt = pyplot()

    rows = results["rows"]
    panels = len(rows) + ("moe" in rows) + ("residual" in rows)
    fig, axes = plt.subplots(1, panels, figsize=(4.5 * panels, 3.8), squeeze=False)
    for ax, (row, variants) in zip(axes[0], rows.items()):
        for r in variants:
            ax.plot([h["step"] for h in r["history"]], [h["loss"] for h in r["history"]],
                    label=r["variant"])  # fmt: skip
        ax.set_title(row)
        ax.set_xlabel("step")
        ax.set_ylabel("training loss (nats)")
        ax.legend(fontsize=8)
    if "residual" in rows:
        ax = axes[0][len(rows)]
        for k, r in enumerate(rows["residual"]):
            for key, style in (("grads_init", ":"), ("grads_trained", "-")):
                v = r[key]
                ax.plot(range(1, len(v) + 1), v, style, color=f"C{k}", marker="o", markersize=3,
                        label=f"{r['variant']}, {key.split('_')[1]}")  # fmt: skip
        ax.set_yscale("log")
        ax.set_title("residual: gradient norm by layer")
        ax.set_xlabel("layer")
        ax.set_ylabel("‖gradient‖ of the block's parameters")
        ax.legend(fontsize=8)
    if "moe" in rows:
        ax = axes[0][-1]
        width = 0.4
        for k, r in enumerate(rows["moe"]):
            shares = [s for layer in r["load"] for s in layer]
            ax.bar([i + k * width for i in range(len(shares))], shares, width, label=r["variant"])
        ax.axhline(rows["moe"][0]["uniform"], color="grey", ls=":", lw=1)
        ax.set_title("MoE: share of routing per expert (all layers)")
        ax.set_xlabel("expert (layer-major)")
        ax.legend(fontsize=8)
    save_png(fig, path)
