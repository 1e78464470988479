"""Adaptive computation time, measured: does a Universal Transformer ponder longer on harder
inputs, and does it beat a fixed-depth model of the same average compute?

The task is parity: ``[CLS] b_1 … b_n`` with n random bits, the label the parity of their sum,
read at ``[CLS]``. Difficulty is the length n (1 … ``max_len``, uniform): a longer string has
more bits to combine. Two models share everything but the halting rule (same seed, same steps,
fresh examples every step):

- ``act``: the shared block applied until each position halts (ACT, up to ``max_steps``; ponder
  cost τ);
- ``fixed``: the same block applied a fixed number of times: ⌊m⌋ and ⌈m⌉ for the ACT model's
  mean steps m per position on the held-out strings (at least 1), one model just below and one
  just above the same compute on average, trained for as many optimizer steps.

Per length: the ACT model's mean steps over the string's positions and at ``[CLS]``, and both
models' held-out accuracy; the rank correlation (Spearman) of length and mean steps.

Outputs: ``table.md``, ``results.json``, ``steps_and_accuracy.png`` and the two models as run
directories ``runs/act`` and ``runs/fixed-<depth>`` (``attnlab explore runs/act`` shows the steps each
position took).

Shape legend: B batch, T = 1 + max_len tokens, N max_steps.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from attnlab.config.base import Config
from attnlab.config.variants import UniversalConfig
from attnlab.data.parity import VOCAB, parity_batch
from attnlab.errors import UserError
from attnlab.experiments import common
from attnlab.fileio import atomic_write_text
from attnlab.layers import evaluating
from attnlab.models.universal import UniversalTransformer
from attnlab.plotting import pyplot, save_png
from attnlab.runs import save_model
from attnlab.train.distributed import resolve_device

__all__ = [
    "AdaptiveComputationConfig",
    "run_adaptive_computation",
    "spearman",
    "save_run",
    "fixed_depths",
]

log = logging.getLogger(__name__)


@dataclass
class AdaptiveComputationConfig(Config):
    """Settings of the adaptive-computation experiment.

    Args:
        max_time: seconds for the whole experiment (two equal training runs and evaluation).
        steps: train each model for exactly this many steps instead (repeatable).
        max_len: the longest bit string (lengths 1 … max_len).
        max_steps: the ACT model's ponder budget N_max.
        ponder_cost: τ.
        halting_bias: the halting unit's initial bias (negative: start with many steps).
        d_model, n_heads: the shared block's size.
        batch_size, lr: fresh strings per step and AdamW's learning rate.
        n_test: held-out strings per length.
        reserve: share of ``max_time`` kept for evaluation and the plot.
        device, seed, progress: as for training.
    """

    max_time: float = 240.0
    steps: int | None = None
    max_len: int = 6
    max_steps: int = 8
    ponder_cost: float = 0.001
    halting_bias: float = -1.0
    d_model: int = 64
    n_heads: int = 4
    batch_size: int = 64
    lr: float = 1e-3
    n_test: int = 200
    reserve: float = 0.1
    device: str = "auto"
    seed: int = 0
    progress: bool = True

    def validate(self) -> None:
        super().validate()
        self.positive("max_time", "steps", "max_len", "d_model", "n_heads", "batch_size", "lr")
        self.positive("n_test")
        self.positive("ponder_cost", allow_zero=True)
        for name in ("lr", "ponder_cost", "halting_bias"):
            if not math.isfinite(getattr(self, name)):
                raise UserError(f"{name} must be a finite number, got {getattr(self, name)!r}")
        common.at_most(self, max_len=512, max_steps=64, d_model=4096, n_heads=64,
                       batch_size=1 << 14, n_test=1 << 16)  # fmt: skip
        if self.max_steps < 1:
            raise UserError(
                f"the ponder budget max_steps={self.max_steps} is below one step (use >= 1)"
            )


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN when either side is constant."""

    def ranks(v):
        a = np.asarray(v, dtype=float)
        order = a.argsort(kind="stable")
        r = np.empty(len(a))
        r[order] = np.arange(len(a), dtype=float)
        for value in np.unique(a):  # ties share their mean rank
            r[a == value] = r[a == value].mean()
        return r

    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def _model(cfg: AdaptiveComputationConfig, halting: str, max_steps: int) -> UniversalTransformer:
    mcfg = UniversalConfig(
        vocab_size=len(VOCAB),
        max_seq_len=1 + cfg.max_len,
        d_model=cfg.d_model,
        n_heads=cfg.n_heads,
        n_classes=2,
        max_steps=max_steps,
        halting=halting,
        ponder_cost=cfg.ponder_cost,
        halting_bias=cfg.halting_bias,
        bias=True,
    )
    torch.manual_seed(cfg.seed)
    return UniversalTransformer(mcfg)


def train_parity(
    model: UniversalTransformer,
    cfg: AdaptiveComputationConfig,
    *,
    steps: int | None,
    deadline: float | None,
    device: torch.device,
) -> dict:
    """AdamW on fresh parity strings (lengths uniform in 1 … max_len) until ``steps`` or the
    ``deadline``.

    Returns:
        ``{"steps", "seconds", "losses"}``.
    """
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    model.to(device).train()
    losses, step, start = [], 0, time.perf_counter()
    while steps is None or step < steps:
        if deadline is not None and time.perf_counter() > deadline:
            break
        lengths = torch.randint(1, cfg.max_len + 1, (cfg.batch_size,), generator=gen)
        idx, mask, labels = (t.to(device) for t in parity_batch(lengths, gen))
        loss = model(idx, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        step += 1
    model.eval()
    return {"steps": step, "seconds": time.perf_counter() - start, "losses": losses}


@torch.no_grad()
def evaluate_by_length(
    model: UniversalTransformer, cfg: AdaptiveComputationConfig, device: torch.device
) -> dict[int, dict]:
    """Per length: accuracy, mean steps over the positions, mean steps at ``[CLS]``."""
    gen = torch.Generator().manual_seed(cfg.seed + 12345)  # the same strings for both models
    out = {}
    with evaluating(model):
        for n in range(1, cfg.max_len + 1):
            idx, mask, labels = (
                t.to(device) for t in parity_batch(torch.full((cfg.n_test,), n), gen)
            )
            o = model(idx, attention_mask=mask)
            out[n] = {
                "accuracy": float((o.logits.argmax(-1) == labels).float().mean()),
                "steps": float(o.steps[mask].float().mean()),
                "steps_cls": float(o.steps[:, 0].float().mean()),
            }
    return out


def save_run(model: UniversalTransformer, run_dir: Path, train: dict) -> None:
    """A run directory :func:`attnlab.load` and ``attnlab explore`` open: ``config.json``
    (kind, model, the parity task, training) and ``model.safetensors``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = {
        "kind": model.kind,
        "model": model.config.to_dict(),
        "task": {"type": "parity", "vocab": list(VOCAB)},
        "train": train,
    }
    atomic_write_text(run_dir / "config.json", json.dumps(cfg, indent=2) + "\n")
    save_model(model, run_dir / "model.safetensors")


def fixed_depths(mean_steps: float) -> list[int]:
    """The fixed depths that bracket the ACT model's mean steps: ⌊mean⌋ and ⌈mean⌉ (one depth
    when the mean is whole), at least 1: one model below, one above equal compute."""
    low = max(1, math.floor(mean_steps))
    return sorted({low, max(1, math.ceil(mean_steps))})


def run_adaptive_computation(
    cfg: AdaptiveComputationConfig, out_dir: str | Path, *, overwrite: bool = False
) -> dict:
    """Train the ACT model, then fixed-depth models at ⌊mean steps⌋ and ⌈mean steps⌉ for as
    many optimizer steps; evaluate all on the same strings.

    Returns:
        ``{"config", "act": {"steps", "seconds", "by_length", "accuracy"}, "fixed": [{"depth",
        "steps", "seconds", "by_length", "accuracy"}], "mean_steps", "spearman", "summary",
        "elapsed"}``.

    Raises:
        RunDirError: ``out_dir`` holds files and ``overwrite`` is not set.
    """
    budget = common.Budget(cfg.max_time)
    out = common.prepare_out_dir(out_dir, overwrite=overwrite)
    device = resolve_device(cfg.device)
    deadline = None
    if cfg.steps is None:  # the ACT run takes a third; the fixed ones then train as many steps
        deadline = time.perf_counter() + budget.share(3, reserve=cfg.reserve * cfg.max_time)
    act = _model(cfg, "act", cfg.max_steps)
    act_run = train_parity(act, cfg, steps=cfg.steps, deadline=deadline, device=device)
    act_eval = evaluate_by_length(act, cfg, device)
    save_run(act.cpu(), out / "runs" / "act", {k: act_run[k] for k in ("steps", "seconds")})
    mean_steps = float(np.mean([r["steps"] for r in act_eval.values()]))

    def accuracy(by_length: dict) -> float:
        return float(np.mean([r["accuracy"] for r in by_length.values()]))

    fixed = []
    for depth in fixed_depths(mean_steps):
        model = _model(cfg, "fixed", depth)
        run = train_parity(model, cfg, steps=act_run["steps"], deadline=None, device=device)
        by_length = evaluate_by_length(model, cfg, device)
        save_run(
            model.cpu(), out / "runs" / f"fixed-{depth}", {k: run[k] for k in ("steps", "seconds")}
        )
        fixed.append({"depth": depth, "steps": run["steps"], "seconds": run["seconds"],
                      "by_length": by_length, "accuracy": accuracy(by_length)})  # fmt: skip
    lengths = list(act_eval)
    results = {
        "config": asdict(cfg),
        "act": {k: act_run[k] for k in ("steps", "seconds")}
        | {"by_length": act_eval, "accuracy": accuracy(act_eval)},
        "fixed": fixed,
        "mean_steps": mean_steps,
        "spearman": spearman(lengths, [act_eval[n]["steps"] for n in lengths]),
    }
    results["summary"] = summarise(results)
    table = common.Table(
        ["length", "ACT steps (mean over positions)", "ACT steps at [CLS]", "ACT accuracy",
         *(f"fixed depth {f['depth']} accuracy" for f in fixed)],
        formats=["", ".2f", ".2f", ".1%", *(".1%" for _ in fixed)],
    )  # fmt: skip
    for n in lengths:
        a = act_eval[n]
        row = [f["by_length"][n]["accuracy"] for f in fixed]
        table.add(n, a["steps"], a["steps_cls"], a["accuracy"], *row)
    table.add("all", mean_steps, float(np.mean([r["steps_cls"] for r in act_eval.values()])),
              results["act"]["accuracy"], *(f["accuracy"] for f in fixed))  # fmt: skip
    depths = " and ".join(str(f["depth"]) for f in fixed)
    notes = (
        f"Universal Transformer (one block, d_model {cfg.d_model}) on parity of 1…{cfg.max_len} "
        f"bits, {act_run['steps']} optimizer steps of {cfg.batch_size} fresh strings per model; "
        f"ACT with budget {cfg.max_steps}, τ = {cfg.ponder_cost:g}, initial halting bias "
        f"{cfg.halting_bias:g}; fixed depths {depths} bracket the ACT model's mean of "
        f"{mean_steps:.2f} steps per position; {cfg.n_test} held-out strings per length, the "
        "same for every model."
    )
    drawn = (plot_steps_and_accuracy, "steps_and_accuracy.png")
    title = "Adaptive computation time: steps and accuracy by difficulty (parity length)"
    common.write_outputs(out, title, [table], results, notes, plot=drawn, budget=budget)
    return results


def summarise(results: dict) -> str:
    fixed = "; ".join(f"fixed depth {f['depth']} {f['accuracy']:.1%}" for f in results["fixed"])
    return (
        f"Spearman correlation of length and ACT steps: {results['spearman']:+.2f}; mean "
        f"accuracy ACT {results['act']['accuracy']:.1%} at {results['mean_steps']:.2f} steps per "
        f"position vs {fixed}."
    )


def plot_steps_and_accuracy(results: dict, path: str | Path) -> None:
    """Left: ACT steps by length; right: both models' accuracy by length."""
    plt = pyplot()

    act, fixed = results["act"]["by_length"], results["fixed"]
    xs = [int(n) for n in act]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(xs, [act[n]["steps"] for n in act], marker="o", label="mean over positions")
    left.plot(xs, [act[n]["steps_cls"] for n in act], marker="s", label="at [CLS]")
    left.set_xlabel("parity length (bits)")
    left.set_ylabel("ACT steps")
    left.legend(fontsize=8)
    right.plot(xs, [act[n]["accuracy"] for n in act], marker="o", label="ACT")
    for f in fixed:
        by = f["by_length"]
        right.plot(
            xs, [by[n]["accuracy"] for n in by], marker="s", label=f"fixed depth {f['depth']}"
        )
    right.axhline(0.5, color="grey", linestyle=":", linewidth=1)
    right.set_xlabel("parity length (bits)")
    right.set_ylabel("held-out accuracy")
    right.legend(fontsize=8)
    save_png(fig, path)
