"""Grokking, measured: modular addition learnt by a one-layer Transformer, with and without
weight decay (Power et al. 2022; Nanda et al. 2023, "Progress measures for grokking").

The task: every pair ``(a, b)`` of ``0 … p-1``, the input the three tokens ``a, b, =`` (``=`` is
token id ``p``), the answer ``(a + b) mod p`` read at the last position. A fraction of the p²
pairs trains (full batch, AdamW), the rest is the test set. The claims: training accuracy
saturates long before test accuracy rises; with weight decay the test accuracy then climbs to
near 100 % (the model "groks"), without it the model stays a memorised lookup table within the
same number of steps; after grokking the embedding is sparse in the Fourier basis over the p
token rows (Nanda et al.'s key frequencies), where at the start and at memorisation it is not.

Measured per run: train/test accuracy and loss over steps, the step where train accuracy passes
99 % and where test accuracy passes 95 %, and :func:`fourier_concentration` of the embedding at
the start, at memorisation, at generalisation and at the end. Each model is saved as a run
directory (``runs/wd-<decay>``) that :func:`attnlab.load` opens; its ``config.json`` ``task``
section records p, the training fraction and the weight decay.

Outputs: ``table.md``, ``results.json``, ``grokking.png`` and ``runs/``.

Shape legend: N pairs, p modulus (p + 1 tokens), C d_model, F frequencies.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config.base import Config
from attnlab.config.lm import ModelConfig
from attnlab.errors import UserError
from attnlab.experiments import common
from attnlab.fileio import atomic_write_text
from attnlab.models.lm import DecoderLM
from attnlab.plotting import pyplot, save_png
from attnlab.runs import save_model

__all__ = [
    "GrokkingConfig",
    "modular_addition",
    "grokking_model",
    "fourier_concentration",
    "train_modular",
    "run_grokking",
]

log = logging.getLogger(__name__)

#: the weight-decay run must fit its training pairs this well before memorise-then-generalise
#: can be read from it (the documented runs reach 100 %; a few steps stay near 1/p)
MEMORISED_TRAIN_ACC = 0.99


@dataclass
class GrokkingConfig(Config):
    """Settings of the grokking experiment (a :class:`~attnlab.config.Config`).

    Args:
        max_time: seconds for the whole experiment (both runs share it equally).
        steps: train every run for exactly this many full-batch steps instead.
        p: the modulus (a prime; Nanda et al. use 113).
        train_fraction: share of the p² pairs that trains (Nanda et al.: 0.3).
        weight_decays: one run per AdamW weight decay (default 1.0 and 0.0).
        d_model, n_heads, ffn_hidden: the one-layer Transformer.
        lr, beta1, beta2: AdamW (Nanda et al.: 1e-3, 0.9, 0.98).
        top_k: frequencies counted by :func:`fourier_concentration`.
        eval_points: about how many steps are evaluated (log-spaced and linear).
        device, seed, progress: as for training.
    """

    max_time: float = 150.0
    steps: int | None = None
    p: int = 23
    train_fraction: float = 0.7
    weight_decays: tuple[float, ...] = (1.0, 0.0)
    d_model: int = 32
    n_heads: int = 4
    ffn_hidden: int = 128
    lr: float = 3e-3
    beta1: float = 0.9
    beta2: float = 0.98
    top_k: int = 4
    eval_points: int = 300
    device: str = "cpu"
    seed: int = 0
    progress: bool = True


def modular_addition(p: int, train_fraction: float, *, seed: int = 0) -> dict[str, Tensor]:
    """Every pair of ``a + b mod p`` as three-token inputs, split into train and test.

    Returns:
        ``{"x_train" (N_train, 3), "y_train" (N_train,), "x_test", "y_test"}``: rows
        ``[a, b, p]`` (``p`` is the ``=`` token) and answers ``(a + b) % p``.

    Raises:
        UserError: ``p < 2`` or a fraction that leaves a split empty.
    """
    if p < 2:
        raise UserError(f"the modulus p must be at least 2, got {p}")
    n = p * p
    n_train = round(train_fraction * n)
    if not 0 < n_train < n:
        raise UserError(f"train fraction {train_fraction} leaves an empty split of {n} pairs")
    a, b = torch.arange(p).repeat_interleave(p), torch.arange(p).repeat(p)  # (N,) each
    x = torch.stack([a, b, torch.full_like(a, p)], dim=1)  # (N, 3)
    y = (a + b) % p
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    tr, te = order[:n_train], order[n_train:]
    return {"x_train": x[tr], "y_train": y[tr], "x_test": x[te], "y_test": y[te]}


def grokking_model(cfg: GrokkingConfig) -> nn.Module:
    """The one-layer :class:`DecoderLM` of the experiment (untied embedding and unembedding,
    learned positions for the three slots), initialised under ``cfg.seed``."""
    mcfg = ModelConfig.preset(
        "tiny",
        vocab_size=cfg.p + 1,
        max_seq_len=3,
        n_layers=1,
        d_model=cfg.d_model,
        n_heads=cfg.n_heads,
        ffn_hidden=cfg.ffn_hidden,
        activation="relu",
        tie_embeddings=False,
        dropout=0.0,
    )
    torch.manual_seed(cfg.seed)
    return DecoderLM(mcfg)


@torch.no_grad()
def fourier_concentration(embedding: Tensor, p: int, top_k: int) -> dict:
    """How much of the embedding's squared norm sits in its ``top_k`` largest frequencies.

    The discrete Fourier transform runs over the ``p`` token rows (``=`` excluded), one
    column at a time; frequencies ``k`` and ``p - k`` are one real frequency (a cosine and a
    sine), so there are ``p // 2`` of them besides the constant ``k = 0``.

    Args:
        embedding: ``(≥p, C)`` the token embedding matrix.
        p: the modulus.
        top_k: how many frequencies count as "the few largest".

    Returns:
        ``{"fraction": share of the squared norm in the top_k frequencies, "top": their k,
        "uniform": what top_k of equal frequencies would hold, "spectrum": per k = 0 … p//2}``.
    """
    w = embedding[:p].double()  # (p, C)
    f = torch.fft.fft(w, dim=0).abs().pow(2).sum(1)  # (p,): energy per DFT row
    half = p // 2
    spectrum = [float(f[0])] + [
        float(f[k] + (f[p - k] if p - k != k else 0.0)) for k in range(1, half + 1)
    ]
    total = sum(spectrum)
    order = sorted(range(len(spectrum)), key=lambda k: -spectrum[k])[:top_k]
    return {
        "fraction": sum(spectrum[k] for k in order) / total,
        "top": sorted(order),
        "uniform": top_k / len(spectrum),
        "spectrum": [s / total for s in spectrum],
    }


def _eval_steps(steps: int, points: int) -> list[int]:
    """About ``points`` steps in 0 … steps: half log-spaced, half evenly spaced."""
    half = max(2, points // 2)
    logs = torch.logspace(0, torch.log10(torch.tensor(float(max(steps, 1)))), half)
    lins = torch.linspace(0, steps, half)
    return sorted({0, steps, *(int(v) for v in logs), *(int(v) for v in lins)})


def _metrics(model: nn.Module, x: Tensor, y: Tensor) -> tuple[float, float]:
    logits = model(x)[:, -1]  # (N, p + 1): the answer read at the "=" position
    return float(F.cross_entropy(logits.float(), y)), float((logits.argmax(-1) == y).float().mean())


def train_modular(
    model: nn.Module,
    data: dict[str, Tensor],
    *,
    steps: int,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.98),
    p: int,
    top_k: int = 4,
    eval_points: int = 300,
    deadline: float | None = None,
) -> dict:
    """Full-batch AdamW on the training pairs; evaluate at log- and evenly spaced steps.

    Args:
        model: the one-layer model (trained in place).
        data: :func:`modular_addition`'s splits.
        steps: optimizer steps.
        deadline: a ``time.perf_counter()`` value after which training stops early.

    Returns:
        ``{"steps", "seconds", "history": [{"step", "train_loss", "train_acc", "test_loss",
        "test_acc"}], "memorised_at" (first evaluated step with train accuracy ≥ 99 %, else
        None), "generalised_at" (test accuracy ≥ 95 %), "fourier": {"start", "memorised",
        "generalised", "end"}: :func:`fourier_concentration` (None where not reached)}``.
    """
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=betas)
    xt, yt, xv, yv = data["x_train"], data["y_train"], data["x_test"], data["y_test"]
    points = set(_eval_steps(steps, eval_points))
    history: list[dict] = []
    four = {"start": None, "memorised": None, "generalised": None, "end": None}
    mem_at = gen_at = None

    def spectrum() -> dict:
        return fourier_concentration(model.tok_emb.weight, p, top_k)

    four["start"] = spectrum()
    start = time.perf_counter()
    step = 0
    for step in range(steps + 1):
        if step in points or (gen_at is None and step % 10 == 0):
            model.eval()
            with torch.no_grad():
                tr_loss, tr_acc = _metrics(model, xt, yt)
                te_loss, te_acc = _metrics(model, xv, yv)
            model.train()
            row = {"step": step, "train_loss": tr_loss, "train_acc": tr_acc}
            row |= {"test_loss": te_loss, "test_acc": te_acc}
            history.append(row)
            if mem_at is None and tr_acc >= 0.99:
                mem_at, four["memorised"] = step, spectrum()
            if gen_at is None and te_acc >= 0.95:
                gen_at, four["generalised"] = step, spectrum()
        if step == steps or (deadline is not None and time.perf_counter() > deadline):
            break
        loss = F.cross_entropy(model(xt)[:, -1], yt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    four["end"] = spectrum()
    return {
        "steps": step,
        "seconds": time.perf_counter() - start,
        "history": history,
        "memorised_at": mem_at,
        "generalised_at": gen_at,
        "fourier": four,
    }


def save_run(model: nn.Module, run_dir: Path, task: dict, train: dict, history: list) -> None:
    """A run directory :func:`attnlab.load` opens: ``config.json`` (kind, model, ``task``,
    ``train``), ``model.safetensors`` and ``metrics.jsonl``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = {"kind": "decoder_lm", "model": model.config.to_dict(), "task": task, "train": train}
    atomic_write_text(run_dir / "config.json", json.dumps(cfg, indent=2) + "\n")
    save_model(model, run_dir / "model.safetensors")
    lines = "".join(json.dumps(r) + "\n" for r in history)
    atomic_write_text(run_dir / "metrics.jsonl", lines)


def run_grokking(cfg: GrokkingConfig, out_dir: str | Path, *, overwrite: bool = False) -> dict:
    """Train one model per weight decay on the same split from the same weights; measure.

    Returns:
        ``{"config", "data", "runs": [{"weight_decay", ...train_modular's numbers}], "summary",
        "elapsed"}``.

    Raises:
        RunDirError: ``out_dir`` holds files and ``overwrite`` is not set.
        UserError: a bad setting.
    """
    if not cfg.weight_decays:
        raise UserError("give at least one weight decay")
    if cfg.steps is not None and cfg.steps < 1:
        raise UserError(f"--steps must be at least 1, got {cfg.steps}")
    budget = common.Budget(cfg.max_time)
    data = modular_addition(cfg.p, cfg.train_fraction, seed=cfg.seed)  # checks p, the fraction
    out = common.prepare_out_dir(out_dir, overwrite=overwrite)
    runs = []
    for i, wd in enumerate(cfg.weight_decays):
        model = grokking_model(cfg)
        share = budget.share(len(cfg.weight_decays) - i, reserve=0.05 * cfg.max_time)
        steps = cfg.steps if cfg.steps is not None else 10**7
        deadline = None if cfg.steps is not None else time.perf_counter() + share
        if cfg.steps is None and i > 0:  # the same number of steps as the first run
            steps = runs[0]["steps"]
            deadline = None
        res = train_modular(
            model,
            data,
            steps=steps,
            lr=cfg.lr,
            weight_decay=wd,
            betas=(cfg.beta1, cfg.beta2),
            p=cfg.p,
            top_k=cfg.top_k,
            eval_points=cfg.eval_points,
            deadline=deadline,
        )
        if cfg.steps is None and i == 0:
            log.info("grokking: %d steps in %.0f s", res["steps"], res["seconds"])
        task = {"task": "modular_addition", "p": cfg.p, "train_fraction": cfg.train_fraction}
        task |= {"equals_token": cfg.p, "seed": cfg.seed}
        train = {"optimizer": "adamw", "weight_decay": wd, "lr": cfg.lr}
        train |= {"betas": [cfg.beta1, cfg.beta2], "steps": res["steps"], "full_batch": True}
        save_run(model, out / "runs" / f"wd-{wd:g}", task, train, res["history"])
        runs.append({"weight_decay": wd, **res})
    results = {
        "config": asdict(cfg),
        "data": {"p": cfg.p, "n_train": len(data["y_train"]), "n_test": len(data["y_test"])},
        "runs": runs,
    }
    results["summary"] = summarise(results)
    table = _table(results)
    notes = (
        f"One-layer DecoderLM (d_model {cfg.d_model}, {cfg.n_heads} heads, ReLU MLP "
        f"{cfg.ffn_hidden}, pre-norm), a + b mod {cfg.p}, {cfg.train_fraction:.0%} of the "
        f"{cfg.p**2} pairs for training, full-batch AdamW lr {cfg.lr:g}, betas "
        f'({cfg.beta1}, {cfg.beta2}). "Fourier top-{cfg.top_k}": share of the embedding\'s '
        f"squared norm in its {cfg.top_k} largest of {cfg.p // 2 + 1} frequencies (equal "
        f"frequencies would hold {cfg.top_k / (cfg.p // 2 + 1):.0%})."
    )
    common.write_outputs(
        out,
        "Grokking: a + b mod p",
        [table],
        results,
        notes,
        plot=(plot_grokking, "grokking.png"),
        budget=budget,
    )
    return results


def _frac(four: dict | None) -> float | None:
    return None if four is None else four["fraction"]


def _table(results: dict) -> common.Table:
    k = results["config"]["top_k"]
    cols = [
        "weight decay",
        "steps",
        "train acc",
        "test acc",
        "train acc ≥ 99 % at",
        "test acc ≥ 95 % at",
        f"Fourier top-{k}: start",
        "at memorisation",
        "at generalisation",
        "end",
    ]
    table = common.Table(cols, formats=["g", "d", ".1%", ".1%", "", "", ".2f", ".2f", ".2f", ".2f"])
    for r in results["runs"]:
        last, f = r["history"][-1], r["fourier"]
        table.add(
            r["weight_decay"],
            r["steps"],
            last["train_acc"],
            last["test_acc"],
            r["memorised_at"],
            r["generalised_at"],
            _frac(f["start"]),
            _frac(f["memorised"]),
            _frac(f["generalised"]),
            _frac(f["end"]),
        )
    return table


def summarise(results: dict) -> str:
    """One sentence per run: when it memorised, whether and when it generalised; or, when the
    weight-decay run has not even memorised the training pairs, "Undertrained … train longer"."""
    cfg = results.get("config") or {}
    decayed = [r for r in results["runs"] if r["weight_decay"] > 0] or results["runs"]
    short = common.undertrained(  # a run that has not memorised cannot grok later
        {f"weight decay {r['weight_decay']:g}": r["history"][-1]["train_acc"] for r in decayed},
        threshold=MEMORISED_TRAIN_ACC,
        what="the training accuracy",
        budget=cfg,
        fmt=common.percent,
    )
    if short is not None:
        return short
    parts = []
    for r in results["runs"]:
        last = r["history"][-1]
        what = f"weight decay {r['weight_decay']:g}: train acc ≥ 99 % at step {r['memorised_at']}"
        if r["generalised_at"] is not None:
            lag = r["generalised_at"] / max(1, r["memorised_at"] or 1)
            what += f", test acc ≥ 95 % at step {r['generalised_at']} ({lag:.0f}× later)"
        else:
            what += f", test acc never reached 95 % (ended at {last['test_acc']:.1%})"
        start, end = _frac(r["fourier"]["start"]), _frac(r["fourier"]["end"])
        what += f" after {r['steps']} steps; embedding Fourier top-k share {start:.2f} → {end:.2f}"
        parts.append(what)
    return "; ".join(parts) + "."


def plot_grokking(results: dict, path: str | Path) -> None:
    """Train and test accuracy and loss over steps (log-scale step axis), one colour per run."""
    plt = pyplot()

    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(11, 4.2))
    for r, colour in zip(results["runs"], ("C0", "C3", "C2", "C1")):
        h = r["history"]
        steps = [max(row["step"], 1) for row in h]
        label = f"wd {r['weight_decay']:g}"
        for ax, key in ((ax_acc, "acc"), (ax_loss, "loss")):
            ax.plot(
                steps,
                [row[f"train_{key}"] for row in h],
                color=colour,
                ls="--",
                label=f"{label} train",
            )
            ax.plot(steps, [row[f"test_{key}"] for row in h], color=colour, label=f"{label} test")
    for ax in (ax_acc, ax_loss):
        ax.set_xscale("log")
        ax.set_xlabel("step")
    ax_loss.set_yscale("log")
    ax_acc.set_ylabel("accuracy")
    ax_loss.set_ylabel("cross-entropy")
    ax_acc.legend(fontsize=8)
    p = results["data"]["p"]
    ax_acc.set_title(f"a + b mod {p}: train saturates, test rises later")
    save_png(fig, path)
