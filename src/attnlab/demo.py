"""``attnlab demo``: a small GPT-style LM on pydoc against an LSTM and a bigram baseline.

1. Train a character-level GPT-style Transformer with RoPE on CPython's pydoc topics for a
   wall-clock budget, its size, batch, window, learning rate and warm-up chosen for the budget and
   this machine's measured speed by the rule of ``attnlab train lm``
   (:func:`attnlab.train.budget.choose_lm_settings`).
2. Train an LSTM LM and a bigram model with the same trainer, on the same batches (windows and
   batch size), for the same wall-clock budget each: the comparison a person waiting for it sees.
   Each model reaches as many tokens as its speed allows; the table shows them beside the loss.
3. Measure all three on the whole held-out split, sample from the Transformer, and write a loss
   curve comparing the three (against training tokens) plus an attention heatmap of the
   Transformer's last layer.
4. Compare them at equal tokens too, on the whole held-out split: every model that read more than
   the fewest tokens any model reached is trained again from the same initialisation for exactly
   that many steps, its schedule (warm-up, cosine decay) fitted to them, and measured like the
   others. (A copy of its weights taken at that point of its longer run would be mid-schedule,
   at a high learning rate, and read worse than a run of that length.)
   The validation curves during training (the same 4 held-out batches for each) are also read at
   that count (:func:`loss_at_tokens`), in the report only.

With ``steps`` every model trains exactly that many steps instead (the same tokens each).
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnlab.config import LMTaskConfig, ModelConfig
from attnlab.decoding import generate
from attnlab.errors import UserError
from attnlab.models.lm import DecoderLM
from attnlab.models.rnn_lm import LSTMLM, BigramConfig, BigramLM, LSTMConfig
from attnlab.plotting import pyplot, save_png
from attnlab.runs import atomic_write_text
from attnlab.tasks.lm import LMTask
from attnlab.train import TrainConfig, clock, train
from attnlab.train.budget import (
    choose_lm_settings,
    fastest_ref_steps_per_s,
    measure_ref_steps_per_s,
    row_warmup,
)
from attnlab.viz.attention import plot_attention_grid

__all__ = ["run_demo"]

PROBE_SEQ_LEN = 64  # the window of the first tokenisation; the rule then picks the real one


def _display(ch: str) -> str:
    return {"\n": "↵", " ": "␣", "\t": "⇥"}.get(ch, ch)


def _plot_val_curves(
    results: dict[str, Any],
    tokens_per_step: int,
    path: Path,
    final: dict[str, float],
    same: str,
) -> None:
    """Train and validation loss against training tokens; the validation points during training
    read 4 batches (``eval_batches``), the star at the end is the final model on the whole
    validation split (``final``: the number the printed table shows). ``same`` says what the
    models share ("60 s each")."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name, res in results.items():
        pts = val_curve(res.history, tokens_per_step)
        train_pts = [
            (r["step"] * tokens_per_step, r["loss"])
            for r in res.history
            if r.get("loss") is not None and "step" in r
        ]
        line = ax.plot(*zip(*pts), marker="o", label=f"{name} (val, 4 batches)")[0] if pts else None
        if pts and name in final:
            ax.plot(
                [pts[-1][0]],
                [final[name]],
                marker="*",
                markersize=11,
                linestyle="none",
                color=line.get_color(),
                label=f"{name} (val, whole split: {final[name]:.2f})",
            )
        if train_pts:
            ax.plot(
                *zip(*train_pts),
                alpha=0.35,
                color=line.get_color() if line else None,
                label=f"{name} (train)",
            )

    ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda x, _: f"{x:,.0f}"))
    ax.set_xlabel("training tokens")
    ax.set_ylabel("cross-entropy (nats / char)")
    ax.set_title(f"pydoc, character level: {same}, same batches and trainer")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_png(fig, path)


#: the models' run directories (``<name>_equal_tokens``: a model trained again for the fewest
#: tokens any model reached)
RUN_DIRS = ("transformer", "lstm", "bigram")
EQUAL_SUFFIX = "_equal_tokens"
#: what a demo directory holds; re-running the demo overwrites exactly these
DEMO_FILES = (
    *RUN_DIRS,
    *(name + EQUAL_SUFFIX for name in RUN_DIRS),
    "loss.png",
    "attention.png",
    "report.json",
)
#: seconds of training per model by default: 3 x 45 s, then the faster models again for the
#: slowest one's tokens (up to ~45 s more), and ~15 s of speed probe, evaluation, sample and
#: plots (about 3 minutes in all)
DEFAULT_BUDGET = 45.0
#: the Transformer's optimizer (the baselines': AdamW): Muon, 0.14 nats/char better per token
#: at the demo's settings, and ahead of AdamW given 37 % more steps; its AdamW part (embeddings,
#: norms, the tied head) at the budget row's ``lr_with_muon`` (benchmarks/demo_recipes.py)
TRANSFORMER_OPTIMIZER = "muon"
#: validation batches of the curves during training (the same batches for every model)
CURVE_BATCHES = 4


def val_curve(history: list[dict], tokens_per_step: int) -> list[tuple[int, float]]:
    """``(training tokens, val_loss)`` of a run's validation records, in order."""
    return [
        (r["step"] * tokens_per_step, r["val_loss"])
        for r in history
        if r.get("val_loss") is not None and "step" in r
    ]


def loss_at_tokens(curve: list[tuple[int, float]], tokens: int) -> float | None:
    """The curve's loss at ``tokens``: linear between the two points around it (None outside
    the curve). A loss curve is convex, so between points this reads a little high."""
    for (t0, y0), (t1, y1) in zip(curve, curve[1:]):
        if t0 <= tokens <= t1:
            return y0 if t1 == t0 else y0 + (y1 - y0) * (tokens - t0) / (t1 - t0)
    if curve and curve[-1][0] == tokens:
        return curve[-1][1]
    return None


def run_demo(
    out: str | Path = "runs/demo",
    *,
    budget: float = DEFAULT_BUDGET,
    steps: int | None = None,
    seed: int = 0,
    device: str = "cpu",
    progress: bool = True,
    val_batches: int | None = None,
    threads: int | None = None,
    log: Callable[[str], None] | None = None,
    optimizer: str = TRANSFORMER_OPTIMIZER,
) -> dict[str, Any]:
    """Run the demo and return a report (also written to ``out/report.json``).

    Args:
        out: output directory; its ``transformer``, ``lstm`` and ``bigram`` runs are overwritten.
        budget: seconds of training for each model, validation included (ignored when ``steps``
            is given).
        steps: train every model for exactly this many steps (tests, reproducible runs).
        seed: seeds the model initialisations, the batches and the sample.
        device: ``cpu`` or ``cuda``.
        progress: show the trainer's progress bars.
        val_batches: measure the final losses on this many batches of 32 windows (default: the
            whole validation split).
        threads: CPU threads for the Transformer (default: torch's count or one thread, whichever
            trains faster right now); the baselines always use one.
        log: called with a line of text at each stage.
        optimizer: the Transformer's optimizer (``TrainConfig.optimizer``: ``muon`` or
            ``adamw``); the baselines train with AdamW.

    Returns:
        ``{"models": [{name, kind, params, steps, tokens, val_loss, time, at_equal,
        curve_at_equal}], "budget", "tokens_per_step", "equal_tokens", "sample", "files", ...}``:
        ``equal_tokens`` is the fewest tokens any model reached; ``at_equal`` is
        ``{"val_loss", "run", "time"}``, the model trained for exactly that many tokens (the
        model itself when it reached no more, else a second run from the same initialisation)
        on the same validation batches as ``val_loss``; ``curve_at_equal`` is the model's
        validation curve during training (``CURVE_BATCHES`` batches) read at ``equal_tokens``
        (None off its curve).

    Raises:
        UserError: a setting out of range; ``out`` holding other files.
    """
    say = log or (lambda s: None)
    for flag, value in (("--steps", steps), ("--val-batches", val_batches), ("--threads", threads)):
        if value is not None and value < 1:
            raise UserError(f"{flag} must be a positive number, got {value}")
    if not 0 < budget < math.inf:
        raise UserError(f"--budget must be a positive number of seconds, got {budget}")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"demo output {str(out)!r} exists and is not a directory")
    entries = [p.name for p in out.iterdir()] if out.exists() else []
    foreign = sorted(n for n in entries if n not in DEMO_FILES and not n.startswith("."))
    if foreign:  # re-running overwrites an earlier demo, never a run or other files
        raise UserError(
            f"refusing to write the demo into {str(out)!r}: it holds other files "
            f"({', '.join(foreign[:5])}); choose another --out"
        )
    out.mkdir(parents=True, exist_ok=True)
    task = LMTask.build(
        LMTaskConfig(data="pydoc", tokenizer="char", seq_len=PROBE_SEQ_LEN, seed=seed)
    )
    V = task.vocab_size
    threads_before = torch.get_num_threads()
    try:
        speed = None
        if device == "cpu" and threads:
            torch.set_num_threads(threads)
        elif device == "cpu" or steps is None:
            # this machine's speed on the rule's reference row; on a CPU with torch's threads
            # and with one, keeping the faster (several times faster on a busy machine)
            speed = fastest_ref_steps_per_s(vocab_size=V, device=device)
            threads = torch.get_num_threads()
        if device == "cpu":
            say(f"using {threads} CPU thread(s) for the Transformer")
        if steps is None and speed is None:
            speed = measure_ref_steps_per_s(vocab_size=V, device=device)
        # the same rule as `attnlab train lm` without a model: size, batch, window, lr, warm-up
        choice = choose_lm_settings(
            budget_s=None if steps is not None else budget,
            steps=steps,
            corpus_tokens=task.n_tokens["train"],
            ref_steps_per_s=speed,
            vocab_size=V,
            optimizer=optimizer,
        )
        say(f"budget rule: {choice.describe()}")
        task = LMTask(task.ids, task.tokenizer, task.config.replace(seq_len=choice.seq_len))
        settings = _DemoSettings(
            out, budget, steps, seed, device, progress, val_batches, threads, say, optimizer
        )
        return _run(settings, task, choice)
    finally:
        torch.set_num_threads(threads_before)


@dataclass(frozen=True)
class _DemoSettings:
    """What :func:`run_demo` was asked for, as :func:`_run` reads it (``threads``: the count
    the Transformer trains with, ``say``: the log callback)."""

    out: Path
    budget: float
    steps: int | None
    seed: int
    device: str
    progress: bool
    val_batches: int | None
    threads: int | None
    say: Callable[[str], None]
    optimizer: str


def _baseline_warmup(steps: int) -> int:
    """The LSTM's and the bigram's warm-up for a run of ``steps``: 20, at most a tenth."""
    return min(20, max(1, steps // 10))


@dataclass(frozen=True)
class _Model:
    """One of the demo's models: its name, run directory, how to build it from the seed, its
    optimizer, learning rate and warm-up for a run of n steps; ``one_thread``: train on one
    thread (an LSTM step is 128 small sequential matmuls, and splitting them over threads costs
    more in synchronisation than it gains: several times slower on a busy 2-core machine)."""

    name: str
    sub: str
    make: Callable[[], torch.nn.Module]
    optimizer: str
    lr: float
    warmup_for: Callable[[int], int]
    one_thread: bool = False


def _run(settings: _DemoSettings, task, choice) -> dict[str, Any]:
    """The three trainings, the measurements and the figures (see :func:`run_demo`)."""
    out, budget, steps, seed, device = (
        settings.out,
        settings.budget,
        settings.steps,
        settings.seed,
        settings.device,
    )
    progress, val_batches, threads, say, optimizer = (
        settings.progress,
        settings.val_batches,
        settings.threads,
        settings.say,
        settings.optimizer,
    )
    V, seq_len, batch = task.vocab_size, choice.seq_len, choice.batch_size
    muon = ", Muon" if optimizer == "muon" else ""
    shift = ", token shift" if choice.model.get("token_shift") else ""
    name_t = f"Transformer ({choice.row.n_layers}x{choice.row.d_model}, RoPE{shift}{muon})"
    common = dict(
        batch_size=batch,
        seed=seed,
        device=device,
        progress=progress,
        log_every=10,
        eval_batches=CURVE_BATCHES,
    )
    if steps is None:  # every model the same wall-clock, validation included
        length: dict[str, Any] = dict(max_time=budget, eval_every=max(50, choice.steps // 8))
        what, warmup_baseline = f"for {budget:.0f} s", 20
    else:
        length = dict(steps=steps, eval_every=max(1, steps // 4))
        what, warmup_baseline = f"for {steps} steps", _baseline_warmup(steps)
    lr, warmup = choice.lr, choice.warmup_steps
    clock.count_from(None)  # each model's clock starts with its training, not with the command
    t_model = choice.model | {"vocab_size": V}
    entries = [
        _Model(
            name_t,
            "transformer",
            lambda: DecoderLM(ModelConfig.from_dict(t_model)),
            optimizer,
            lr,
            lambda n: row_warmup(choice.row, n),
        ),
        _Model(
            "LSTM (1 layer, 256)",
            "lstm",
            lambda: LSTMLM(LSTMConfig.preset("small", vocab_size=V, max_seq_len=seq_len)),
            "adamw",
            1e-2,
            _baseline_warmup,
            one_thread=True,
        ),
        _Model(
            "bigram",
            "bigram",
            lambda: BigramLM(BigramConfig(vocab_size=V, max_seq_len=seq_len)),
            "adamw",
            1e-1,
            _baseline_warmup,
            one_thread=True,
        ),
    ]

    def fit(entry: _Model, model, length: dict[str, Any], warmup_steps: int, sub: str):
        """Train one model into ``out / sub``; returns (TrainResult, seconds)."""
        cfg = TrainConfig(
            lr=entry.lr, warmup_steps=warmup_steps, optimizer=entry.optimizer, **length, **common
        )
        before = torch.get_num_threads()
        if entry.one_thread:
            torch.set_num_threads(1)
        t0 = time.time()
        try:
            return train(model, task, cfg, out / sub, overwrite=True), time.time() - t0
        finally:
            torch.set_num_threads(before)

    results, times, models = {}, [], {}
    for i, entry in enumerate(entries, start=1):
        say(f"[{i}/3] {entry.name} {what} ...")
        torch.manual_seed(seed)
        model = entry.make()
        # the Transformer's warm-up is the rule's (for the steps it expects); the baselines' 20
        model_warmup = warmup if i == 1 else warmup_baseline
        results[entry.name], elapsed = fit(entry, model, length, model_warmup, entry.sub)
        times.append(elapsed)
        models[entry.name] = model

    tokens_per_step = batch * seq_len
    equal_steps = min(res.steps for res in results.values())
    equal = equal_steps * tokens_per_step  # the fewest tokens
    # at equal tokens: each model that read more, again from the seed for exactly equal_steps
    at_equal: dict[str, dict[str, Any]] = {}
    for entry in entries:
        again = out / (entry.sub + EQUAL_SUFFIX)
        if results[entry.name].steps == equal_steps:
            if again.exists():  # an earlier demo's second run: not this demo's
                shutil.rmtree(again)
            continue
        say(f"at equal tokens: {entry.name} again for {equal_steps:,} steps ({equal:,} tokens)")
        torch.manual_seed(seed)
        model = entry.make()
        length_equal = dict(steps=equal_steps, eval_every=max(1, equal_steps // 4))
        warmup_equal = entry.warmup_for(equal_steps)
        result, elapsed = fit(entry, model, length_equal, warmup_equal, again.name)
        loss = task.val_loss(model, batch_size=32, n_batches=val_batches)["loss"]
        at_equal[entry.name] = {"val_loss": loss, "run": str(result.run_dir), "time": elapsed}

    say("measuring the whole validation split ...")
    rows = []
    for (name, model), elapsed in zip(models.items(), times):
        val = task.val_loss(model, batch_size=32, n_batches=val_batches)
        own = {"val_loss": val["loss"], "run": str(results[name].run_dir), "time": elapsed}
        at = at_equal.get(name, own)
        n_params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        n_steps = results[name].steps
        rows.append(
            {
                "name": name,
                "kind": model.kind,
                "params": n_params,
                "steps": n_steps,
                "tokens": n_steps * batch * seq_len,
                "val_loss": val["loss"],
                "time": elapsed,
                "at_equal": at,
                "curve_at_equal": loss_at_tokens(
                    val_curve(results[name].history, tokens_per_step), equal
                ),
            }
        )

    # a sample and one attention map from the Transformer
    transformer = models[name_t]
    dev = next(transformer.parameters()).device
    prompt = "The "
    gen = torch.Generator(device=dev).manual_seed(seed)
    ids = torch.tensor([task.tokenizer.encode(prompt)], device=dev)
    sample_ids = generate(transformer, ids, 300, temperature=0.8, generator=gen)
    sample = task.tokenizer.decode(sample_ids[0].tolist())

    text_ids = next(task.eval_batches(1, 1))[0][:, :32].to(dev)  # (1, 32) held-out characters
    with torch.no_grad():
        _, weights_all = transformer(text_ids, need_weights=True)  # one (1, H, T, T) per block
    weights = weights_all[-1][0]  # (H, T, T)
    chars = [_display(c) for c in task.tokenizer.decode(text_ids[0].tolist())]
    files = {
        "attention heatmap": out / "attention.png",
        "loss curves": out / "loss.png",
        "report": out / "report.json",
    }
    plot_attention_grid(
        weights,
        files["attention heatmap"],
        rows=chars,
        cols=chars,
        title=f"Transformer, last layer ({len(weights_all)} of {len(weights_all)}), "
        f"{weights.shape[0]} heads and their mean: attention over {len(chars)} held-out "
        f"characters, {''.join(chars)!r} (rows: queries)",
    )
    final = {row["name"]: row["val_loss"] for row in rows}
    same = f"{budget:.0f} s each" if steps is None else f"{steps} steps each"
    _plot_val_curves(results, tokens_per_step, files["loss curves"], final, same)

    report = {
        "threads": threads,
        "models": rows,
        "budget": budget if steps is None else None,
        "tokens_per_step": tokens_per_step,
        "equal_tokens": equal,
        "curve_batches": CURVE_BATCHES,
        "tokenizer": "char",
        "budget_row": choice.row.name,
        "seq_len": seq_len,
        "batch_size": batch,
        "lr": lr,
        "warmup_steps": warmup,
        "optimizer": optimizer,
        "temperature": 0.8,
        "sample": sample,
        "files": {k: str(v) for k, v in files.items()},
        "runs": {name: str(res.run_dir) for name, res in results.items()},
    }
    atomic_write_text(files["report"], json.dumps(report, indent=2) + "\n")
    return report


def format_report(report: dict[str, Any], seconds: float) -> str:
    """What ``attnlab demo`` prints at the end: the final losses of the three models beside the
    tokens each read and their validation curves at equal tokens, the sample, the files written
    and the time the demo took."""
    same = (
        f"{report['budget']:.0f} s of training each"
        if report["budget"] is not None
        else f"{report['models'][0]['steps']} steps each"
    )
    w = max(32, *(len(row["name"]) + 2 for row in report["models"]))  # the name column
    lines = [
        "",
        f"Validation loss of the final models on the whole held-out pydoc split (the plot's "
        f"stars; its circles read 4 batches during training); {same}, the same batches of "
        f"{report['batch_size']} windows of {report['seq_len']} characters "
        f"({report['tokenizer']} tokenizer):",
        f"  {'model':<{w}}{'params':>10}{'tokens':>12}{'val loss':>10}{'ppl':>9}{'time':>8}"
        f"{'at equal tokens*':>18}",
    ]
    for row in report["models"]:
        at = f"{row['at_equal']['val_loss']:.4f}"
        lines.append(
            f"  {row['name']:<{w}}{row['params']:>10,}{row['tokens']:>12,}{row['val_loss']:>10.4f}"
            f"{math.exp(row['val_loss']):>9.2f}{row['time']:>7.0f}s{at:>18}"
        )
    lines.append(
        f"  * the same whole split, every model trained for {report['equal_tokens']:,} tokens, "
        "the fewest any model reached (a model that read more trained again from the same "
        "initialisation for exactly that many, its schedule fitted to them)"
    )
    lines += ["", f"Sample (temperature {report['temperature']}):", report["sample"], ""]
    lines += [f"{name}: {path}" for name, path in report["files"].items()]
    lines.append(f"demo finished in {seconds:.0f} s")
    return "\n".join(lines)
