"""RNN vs 1-D CNN vs self-attention, measured: the lecture's comparison table as numbers.

The notes compare the three sequence primitives on parallelism, receptive field, position
information, long-range dependency and cost. Three language models of (nearly) equal parameter
count, each width chosen so its count is nearest to ``params``:

- ``lstm``: :class:`attnlab.models.rnn_lm.LSTMLM` (one layer; h_t needs h_{t−1}: T sequential
  steps);
- ``cnn``: :class:`attnlab.models.conv_lm.CausalConvLM` (causal dilated convolutions; the
  receptive field R = 1 + Σ (k − 1)·d_l);
- ``transformer``: :class:`attnlab.DecoderLM` (RoPE positions; every position sees every earlier
  one in one layer).

Each is trained, in lockstep (the same steps on the same batches), on recall at a distance
(:mod:`attnlab.data.recall`):
the key D positions before the last must be predicted at the last position, for D uniform in
1 … ``max_distance``. Measured:

- accuracy by distance on held-out sequences; the CNN cannot see a key at D ≥ R, so it is at
  chance 1 / n_keys there whatever it learnt;
- seconds per training step (forward + backward) by sequence length, batch ``time_batch``, the
  fastest of ``time_repeats``;
- ‖∂ logits_{T−1} / ∂ e_{T−1−D}‖_F, the norm of the Jacobian of the last position's logits with
  respect to the key's input embedding D positions back, at initialisation and after training:
  exactly zero for the CNN at D ≥ R.

Outputs: ``table.md``, ``results.json`` and ``sequence_primitives.png``.

Shape legend: B batch, T sequence length, V vocabulary, E embedding width.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config.base import Config
from attnlab.config.lm import ConvLMConfig, LSTMConfig, ModelConfig
from attnlab.data.recall import recall_batch, recall_vocab_size
from attnlab.errors import UserError
from attnlab.experiments import common
from attnlab.models.conv_lm import CausalConvLM
from attnlab.models.lm import DecoderLM
from attnlab.models.rnn_lm import LSTMLM
from attnlab.plotting import pyplot, save_png
from attnlab.train.distributed import resolve_device

__all__ = [
    "SequencePrimitivesConfig",
    "run_sequence_primitives",
    "MODELS",
    "build_primitive",
    "match_width",
    "count_parameters",
    "accuracy_by_distance",
    "gradient_by_distance",
    "time_by_length",
    "train_recall",
    "eval_distances",
]

log = logging.getLogger(__name__)

MODELS = ("lstm", "cnn", "transformer")
LABELS = {"lstm": "LSTM", "cnn": "CNN", "transformer": "Transformer"}


@dataclass
class SequencePrimitivesConfig(Config):
    """Settings of the sequence-primitives experiment.

    Args:
        max_time: seconds for the whole experiment (timing, training, evaluation, plot).
        steps: train each model for exactly this many steps instead (repeatable).
        models: which of ``lstm``, ``cnn``, ``transformer``.
        params: the parameter count every model's width is matched to.
        n_keys, n_fillers: key and filler symbols of the recall task (chance is 1 / n_keys).
        max_distance: the longest distance trained on; sequences are ``max_distance + 1`` long.
        distances: the distances evaluated (None: 1, 2, 4, … up to max_distance, R − 1 and R).
        kernel_size, dilations: the CNN's layers (R = 1 + Σ (k − 1)·d).
        n_layers, n_heads: the Transformer's depth and heads.
        batch_size, lr: sequences per step and AdamW's peak learning rate (linear warm-up).
        n_test: held-out sequences per distance.
        n_grad: sequences per distance for the gradient norm.
        lengths: sequence lengths timed; time_batch, time_repeats: batch and repeats of the timing.
        reserve: share of ``max_time`` kept for evaluation and the plot.
        device, seed, progress: as for training.
    """

    max_time: float = 240.0
    steps: int | None = None
    models: tuple[str, ...] = MODELS
    params: int = 50_000
    n_keys: int = 8
    n_fillers: int = 1
    max_distance: int = 64
    distances: tuple[int, ...] | None = None
    kernel_size: int = 3
    dilations: tuple[int, ...] = (1, 2, 4, 8)
    n_layers: int = 2
    n_heads: int = 2
    batch_size: int = 32
    lr: float = 5e-3
    n_test: int = 256
    n_grad: int = 16
    lengths: tuple[int, ...] = (64, 128, 256, 512, 1024)
    time_batch: int = 8
    time_repeats: int = 3
    reserve: float = 0.1
    device: str = "auto"
    seed: int = 0
    progress: bool = True

    @property
    def receptive_field(self) -> int:
        """The CNN's R = 1 + Σ (k − 1)·d."""
        return 1 + sum((self.kernel_size - 1) * d for d in self.dilations)

    def validate(self) -> None:
        super().validate()
        self.positive("max_time", "steps", "params", "n_keys", "n_fillers", "kernel_size")
        self.positive("n_layers", "n_heads", "batch_size", "lr", "n_test", "n_grad")
        self.positive("time_batch", "time_repeats")
        self.fraction("reserve")
        bad = [m for m in self.models if m not in MODELS]
        if bad or not self.models:
            raise UserError(f"--models must name some of {', '.join(MODELS)}; got {bad or '[]'}")
        if self.max_distance < 2:
            raise UserError(f"--max-distance must be at least 2, got {self.max_distance}")
        if not self.dilations or min(self.dilations) < 1:
            raise UserError(f"--dilations must be positive integers, got {self.dilations}")
        if self.distances is not None:
            off = [d for d in self.distances if not 1 <= d <= self.max_distance]
            if off or not self.distances:
                raise UserError(
                    f"--distances must lie in 1 … --max-distance {self.max_distance}, got "
                    f"{list(self.distances)}"
                )
        if not self.lengths or min(self.lengths) < 2:
            raise UserError(f"--lengths must be at least 2 tokens each, got {self.lengths}")
        if not math.isfinite(self.lr):
            raise UserError(f"--lr must be a finite number, got {self.lr!r}")
        common.at_most(self, params=10**8, max_distance=4096, n_test=1 << 16,
                       batch_size=1 << 14, n_heads=64, n_layers=64)  # fmt: skip
        if max(self.lengths) > 1 << 16:
            raise UserError(f"--lengths at most {1 << 16} tokens, got {max(self.lengths)}")


def eval_distances(cfg: SequencePrimitivesConfig) -> list[int]:
    """The distances evaluated: ``cfg.distances``, or 1, 2, 4, … ≤ max_distance with the CNN's
    last visible distance R − 1, the first invisible one R, and max_distance."""
    if cfg.distances is not None:
        return sorted(set(cfg.distances))
    r = cfg.receptive_field
    ds = {2**i for i in range(int(math.log2(cfg.max_distance)) + 1)}
    ds |= {d for d in (r - 1, r, cfg.max_distance) if 1 <= d <= cfg.max_distance}
    return sorted(ds)


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (a tied matrix counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def build_primitive(name: str, width: int, cfg: SequencePrimitivesConfig) -> nn.Module:
    """The model ``name`` (``lstm``, ``cnn``, ``transformer``) at ``width`` for this task; its
    context covers both the training sequences and the timed lengths."""
    V = recall_vocab_size(cfg.n_keys, cfg.n_fillers)
    L = max(cfg.max_distance + 1, *cfg.lengths)
    if name == "lstm":
        return LSTMLM(LSTMConfig(vocab_size=V, max_seq_len=L, emb_dim=width, hidden=width))
    if name == "cnn":
        c = ConvLMConfig(vocab_size=V, max_seq_len=L, width=width,
                         kernel_size=cfg.kernel_size, dilations=cfg.dilations)  # fmt: skip
        return CausalConvLM(c)
    if name == "transformer":
        c = ModelConfig(vocab_size=V, max_seq_len=L, d_model=width, n_layers=cfg.n_layers,
                        n_heads=cfg.n_heads, position="rope")  # fmt: skip
        return DecoderLM(c)
    raise UserError(f"unknown sequence model {name!r}; choose from {', '.join(MODELS)}")


def match_width(count: Callable[[int], int], target: int, step: int = 1) -> int:
    """The multiple of ``step`` whose ``count(width)`` (increasing in width) is nearest to
    ``target``: a bisection for the widest at or under it, then that or the next multiple."""
    lo, hi = 1, 1
    while count(hi * step) <= target and hi < 1 << 14:
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # count(lo·step) ≤ target < count(hi·step), or lo = 1
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if count(mid * step) <= target else (lo, mid)
    best = min((lo, hi), key=lambda m: abs(count(m * step) - target))
    return best * step


def _width_step(name: str, cfg: SequencePrimitivesConfig) -> int:
    return 2 * cfg.n_heads if name == "transformer" else 1  # RoPE: an even head width


def _last_logits(model: nn.Module, idx: Tensor) -> Tensor:
    return model(idx)[:, -1]  # (B, V)


def train_recall(
    models: dict[str, nn.Module],
    cfg: SequencePrimitivesConfig,
    *,
    steps: int,
    device: torch.device,
    deadline: float | None = None,
) -> dict:
    """AdamW on fresh recall sequences, the models in lockstep: each batch trains every model
    once, so all take the same steps on the same batches however the machine's load changes,
    and the ``deadline`` (a ``time.perf_counter()`` value) stops them together. The loss is the
    cross-entropy of the key at the last position; a linear warm-up over the first fifth of
    ``steps`` (at most 100), then constant; gradient clipping at 1.

    Returns:
        ``{"steps", "seconds": {name: training seconds}, "losses": {name: [per step]}}``.
    """
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    warm = common.warmup_within(steps, 100)
    opts, scheds = {}, {}
    for name, model in models.items():
        model.to(device).train()
        opts[name] = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
        scheds[name] = torch.optim.lr_scheduler.LambdaLR(
            opts[name], lambda s: min(1.0, (s + 1) / warm)
        )
    T = cfg.max_distance + 1
    losses = {name: [] for name in models}
    seconds = dict.fromkeys(models, 0.0)
    done = 0
    while done < steps and (deadline is None or time.perf_counter() < deadline):
        d = torch.randint(1, cfg.max_distance + 1, (cfg.batch_size,), generator=gen)
        idx, keys = (t.to(device) for t in recall_batch(d, T, cfg.n_keys, cfg.n_fillers, gen))
        for name, model in models.items():
            start = time.perf_counter()
            loss = F.cross_entropy(_last_logits(model, idx), keys)
            opts[name].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opts[name].step()
            scheds[name].step()
            losses[name].append(loss.item())  # (.item() waits for the device: timed in full)
            seconds[name] += time.perf_counter() - start
        done += 1
    for model in models.values():
        model.eval()
    return {"steps": done, "seconds": seconds, "losses": losses}


@torch.no_grad()
def accuracy_by_distance(
    model: nn.Module, cfg: SequencePrimitivesConfig, distances: list[int], device: torch.device
) -> dict[int, float]:
    """Held-out accuracy at each distance (``n_test`` sequences each, the same for every
    model): the argmax of the last position's logits against the key."""
    gen = torch.Generator().manual_seed(cfg.seed + 12345)
    model.eval()
    out = {}
    for d in distances:
        dist = torch.full((cfg.n_test,), d)
        idx, keys = recall_batch(dist, cfg.max_distance + 1, cfg.n_keys, cfg.n_fillers, gen)
        pred = _last_logits(model, idx.to(device)).argmax(-1).cpu()
        out[d] = float((pred == keys).float().mean())
    return out


def gradient_by_distance(
    model: nn.Module, cfg: SequencePrimitivesConfig, distances: list[int], device: torch.device
) -> dict[int, float]:
    """Mean over ``n_grad`` sequences of ‖∂ logits_{T−1} / ∂ e_{T−1−D}‖_F: the Jacobian of the
    last position's V logits with respect to the input embedding of the key D positions back
    (``model.tok_emb``'s output; one backward pass per logit, each giving every position).

    The model runs in training mode (dropout is 0 here; recurrent backends need it for
    backward) and its parameters' gradients are left untouched.
    """
    gen = torch.Generator().manual_seed(cfg.seed + 54321)
    T = cfg.max_distance + 1
    captured: list[Tensor] = []

    def keep(_module, _inputs, output: Tensor) -> None:
        captured.append(output)

    handle = model.tok_emb.register_forward_hook(keep)
    was_training = model.training
    model.to(device).train()
    out = {}
    try:
        for d in distances:
            idx, _ = recall_batch(torch.full((cfg.n_grad,), d), T, cfg.n_keys, cfg.n_fillers, gen)
            captured.clear()
            logits = _last_logits(model, idx.to(device))  # (B, V)
            emb = captured[0]  # (B, T, E)
            sq = torch.zeros(cfg.n_grad, device=device)
            for v in range(logits.shape[-1]):
                (g,) = torch.autograd.grad(logits[:, v].sum(), emb, retain_graph=True)
                sq += g[:, T - 1 - d].pow(2).sum(-1)  # rows are independent: per-row Jacobian
            out[d] = float(sq.sqrt().mean())
    finally:
        handle.remove()
        model.train(was_training)
    return out


def time_by_length(
    model: nn.Module, cfg: SequencePrimitivesConfig, device: torch.device
) -> dict[int, float]:
    """Seconds of one training step's forward and backward (cross-entropy at every position) at
    each of ``cfg.lengths``, batch ``time_batch``: the fastest of ``time_repeats`` after one
    untimed step, on a copy of ``model``."""
    probe = copy.deepcopy(model).to(device).train()
    V = recall_vocab_size(cfg.n_keys, cfg.n_fillers)
    gen = torch.Generator().manual_seed(cfg.seed + 7)
    out = {}
    for T in cfg.lengths:
        idx = torch.randint(0, V, (cfg.time_batch, T + 1), generator=gen).to(device)
        best = math.inf
        for rep in range(cfg.time_repeats + 1):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            logits = probe(idx[:, :-1])  # (B, T, V)
            F.cross_entropy(logits.reshape(-1, V), idx[:, 1:].reshape(-1)).backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if rep:  # the first step is untimed (allocations, kernel choice)
                best = min(best, time.perf_counter() - start)
            probe.zero_grad(set_to_none=True)
        out[T] = best
    return out


def _seconds_per_step(models: dict[str, nn.Module], cfg: SequencePrimitivesConfig, device):
    """Seconds of one lockstep step of copies of ``models`` (3 untimed steps, then 10 timed)."""
    probes = {name: copy.deepcopy(m) for name, m in models.items()}
    train_recall(probes, cfg, steps=3, device=device)
    return sum(train_recall(probes, cfg, steps=10, device=device)["seconds"].values()) / 10


def sequential_steps(name: str, T: int, cfg: SequencePrimitivesConfig) -> int:
    """Dependent steps along time in one forward pass (counted, not measured): T for the
    recurrence, one per layer for the convolutions and the attention layers."""
    return {"lstm": T, "cnn": len(cfg.dilations), "transformer": cfg.n_layers}[name]


def run_sequence_primitives(
    cfg: SequencePrimitivesConfig, out_dir: str | Path, *, overwrite: bool = False
) -> dict:
    """Build the models at matched parameter counts, time them by length, train them in
    lockstep until ``steps`` or the budget, then measure accuracy and gradient norms by
    distance.

    Returns:
        ``{"config", "receptive_field", "chance", "distances", "models": {name: {"width",
        "params", "steps", "seconds", "final_loss", "accuracy", "gradient_init", "gradient",
        "time"}}, "summary", "elapsed"}``.

    Raises:
        RunDirError: ``out_dir`` holds files and ``overwrite`` is not set.
    """
    budget = common.Budget(cfg.max_time)
    out = common.prepare_out_dir(out_dir, overwrite=overwrite)
    device = resolve_device(cfg.device)
    distances = eval_distances(cfg)
    models: dict[str, nn.Module] = {}
    runs: dict[str, dict] = {}
    for name in cfg.models:
        width = match_width(lambda w, n=name: count_parameters(build_primitive(n, w, cfg)),
                            cfg.params, _width_step(name, cfg))  # fmt: skip
        torch.manual_seed(cfg.seed)
        models[name] = model = build_primitive(name, width, cfg).to(device)
        runs[name] = {"width": width, "params": count_parameters(model)}
        runs[name]["time"] = time_by_length(model, cfg, device)
        runs[name]["gradient_init"] = gradient_by_distance(model, cfg, distances, device)
    steps, deadline = cfg.steps, None
    if steps is None:  # the probe sizes the warm-up; the deadline holds the budget regardless
        share = budget.share(1, reserve=cfg.reserve * cfg.max_time)
        steps = common.steps_within(share, _seconds_per_step(models, cfg, device))
        deadline = time.perf_counter() + budget.share(1, reserve=cfg.reserve * cfg.max_time)
    res = train_recall(models, cfg, steps=steps, device=device, deadline=deadline)
    for name, model in models.items():
        losses = res["losses"][name]
        tail = losses[-max(1, len(losses) // 10) :]
        runs[name] |= {"steps": res["steps"], "seconds": res["seconds"][name],
                       "final_loss": sum(tail) / len(tail) if tail else float("nan")}  # fmt: skip
        runs[name]["accuracy"] = accuracy_by_distance(model, cfg, distances, device)
        runs[name]["gradient"] = gradient_by_distance(model, cfg, distances, device)
        if cfg.progress:
            log.info("%s: %d steps in %.0f s, final loss %.3f", name, res["steps"],
                     runs[name]["seconds"], runs[name]["final_loss"])  # fmt: skip
    results = {
        "config": asdict(cfg),
        "receptive_field": cfg.receptive_field,
        "chance": 1.0 / cfg.n_keys,
        "distances": distances,
        "models": runs,
    }
    results["summary"] = summarise(results, cfg)
    tables = _tables(results, cfg)
    notes = _notes(results, cfg)
    drawn = (plot_sequence_primitives, "sequence_primitives.png")
    title = "RNN vs 1-D CNN vs self-attention: recall at a distance, time by length, gradients"
    common.write_outputs(out, title, tables, results, notes, plot=drawn, budget=budget)
    return results


def _tables(results: dict, cfg: SequencePrimitivesConfig) -> list[common.Table]:
    runs, names, r = results["models"], list(results["models"]), results["receptive_field"]
    setup = common.Table(
        ["model", "width", "parameters", "training steps", "training seconds", "final loss",
         "dependent steps along time (T = max distance + 1)"],
        formats=["", "", ",", "", ".0f", ".3f", ""],
    )  # fmt: skip
    T = cfg.max_distance + 1
    for n in names:
        m = runs[n]
        setup.add(LABELS[n], m["width"], m["params"], m["steps"], m["seconds"],
                  m["final_loss"], sequential_steps(n, T, cfg))  # fmt: skip
    cnn_seen = f"CNN sees the key (D ≤ R − 1 = {r - 1})"
    acc = common.Table(["distance D", cnn_seen, *(f"{LABELS[n]} accuracy" for n in names)],
                       formats=["", "", *(".1%" for _ in names)])  # fmt: skip
    for d in results["distances"]:
        acc.add(d, "yes" if d <= r - 1 else "no", *(runs[n]["accuracy"][d] for n in names))
    timing = common.Table(
        ["sequence length", *(f"{LABELS[n]} ms / step" for n in names)],
        formats=["", *(".1f" for _ in names)],
    )
    for length in cfg.lengths:
        timing.add(length, *(1000 * runs[n]["time"][length] for n in names))
    first, last = cfg.lengths[0], cfg.lengths[-1]
    timing.add(f"ratio {last} / {first}",
               *(runs[n]["time"][last] / runs[n]["time"][first] for n in names))  # fmt: skip
    grad = common.Table(
        ["distance D", *(f"{LABELS[n]} {when}" for n in names for when in ("init", "trained"))],
        formats=["", *(".3g" for _ in names for _ in range(2))],
    )
    for d in results["distances"]:
        grad.add(d, *(runs[n][k][d] for n in names for k in ("gradient_init", "gradient")))
    return [setup, acc, timing, grad]


def _notes(results: dict, cfg: SequencePrimitivesConfig) -> str:
    r = results["receptive_field"]
    dil = ", ".join(map(str, cfg.dilations))
    return (
        f"Recall at a distance: sequences of {cfg.max_distance + 1} tokens ({cfg.n_fillers} "
        f"filler symbols), one of {cfg.n_keys} keys D positions before the last, which must "
        f"predict it (chance {results['chance']:.1%}); D uniform in 1 … {cfg.max_distance} for "
        f"training, {cfg.n_test} held-out sequences per evaluated D. Widths matched to "
        f"{cfg.params:,} parameters. CNN: kernel {cfg.kernel_size}, dilations {dil}: receptive "
        f"field R = 1 + Σ (k − 1)·d = {r} tokens (the key is visible at D ≤ {r - 1}). "
        f"Transformer: {cfg.n_layers} layers, {cfg.n_heads} heads, RoPE. Batch "
        f"{cfg.batch_size}, AdamW lr {cfg.lr:g}, clipping 1.0. Time per step: forward + "
        f"backward of the cross-entropy at every position, batch {cfg.time_batch}, the fastest "
        f"of {cfg.time_repeats}, on {resolve_device(cfg.device)} as the machine was (other jobs "
        "included: compare the columns, not the absolute numbers). Gradient: mean over "
        f"{cfg.n_grad} sequences of ‖∂ logits at the last position / ∂ the key's input "
        "embedding‖ (Frobenius norm of the Jacobian), at initialisation and after training."
    )


def summarise(results: dict, cfg: SequencePrimitivesConfig) -> str:
    """The reading: CNN within and beyond its receptive field, the others beyond it, the time
    growth, the gradients past R; or the undertrained paragraph."""
    runs, r, chance = results["models"], results["receptive_field"], results["chance"]
    first = results["distances"][0]
    short = common.undertrained(
        {LABELS[n]: m["accuracy"][first] for n, m in runs.items()},
        threshold=min(0.5, 2 * chance), what=f"accuracy at D = {first}",
        max_time=None if cfg.steps else cfg.max_time, steps=cfg.steps,
        fmt=lambda v: f"{v:.0%}",
    )  # fmt: skip
    if short:
        return short
    beyond = [d for d in results["distances"] if d >= r]
    within = [d for d in results["distances"] if d < r]

    def mean(name: str, ds: list[int]) -> float:
        return sum(runs[name]["accuracy"][d] for d in ds) / len(ds) if ds else float("nan")

    parts = []
    if beyond:
        acc = "; ".join(f"{LABELS[n]} {mean(n, beyond):.1%}" for n in runs)
        parts.append(f"Mean accuracy at D ≥ R = {r} (chance {chance:.1%}): {acc}.")
    if within and "cnn" in runs:
        parts.append(f"The CNN at D ≤ {r - 1}: {mean('cnn', within):.1%}.")
    if "cnn" in runs and beyond:
        zero = all(runs["cnn"]["gradient"][d] == 0.0 for d in beyond)
        parts.append(
            f"Its gradient with respect to the key past R is {'exactly 0' if zero else 'NOT 0'}."
        )
    a, b = cfg.lengths[0], cfg.lengths[-1]
    growth = "; ".join(f"{LABELS[n]} ×{m['time'][b] / m['time'][a]:.1f}" for n, m in runs.items())
    parts.append(f"Time per step from T = {a} to {b} (×{b / a:g} tokens): {growth}.")
    return " ".join(parts)


def plot_sequence_primitives(results: dict, path: str | Path) -> None:
    """Accuracy by distance (R and chance marked), time per step by length, and the gradient
    norm by distance (log scale; exact zeros drawn at the bottom edge)."""
    plt = pyplot()
    runs, r = results["models"], results["receptive_field"]
    fig, (left, mid, right) = plt.subplots(1, 3, figsize=(15, 4))
    for n, m in runs.items():
        ds = [int(d) for d in m["accuracy"]]
        left.plot(ds, list(m["accuracy"].values()), marker="o", label=LABELS[n])
        ts = [int(t) for t in m["time"]]
        mid.plot(ts, [1000 * s for s in m["time"].values()], marker="o", label=LABELS[n])
        g = list(m["gradient"].values())
        floor = min([v for mm in runs.values() for v in mm["gradient"].values() if v > 0] or [1])
        right.plot([int(d) for d in m["gradient"]], [v if v > 0 else floor / 10 for v in g],
                   marker="o", label=LABELS[n])  # fmt: skip
    for ax in (left, right):
        ax.axvline(r - 0.5, color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel("distance D")
    left.axhline(results["chance"], color="grey", linestyle=":", linewidth=1)
    left.set_ylabel("held-out accuracy")
    left.set_title(f"recall (CNN receptive field R = {r})")
    mid.set_xscale("log", base=2)
    mid.set_yscale("log")
    mid.set_xlabel("sequence length")
    mid.set_ylabel("ms per training step")
    right.set_yscale("log")
    right.set_ylabel("‖∂ logits_last / ∂ e_key‖ (trained; 0 at the bottom)")
    for ax in (left, mid, right):
        ax.legend(fontsize=8)
    save_png(fig, path)
