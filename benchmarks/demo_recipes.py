"""The demo's Transformer against its LSTM at equal steps (equal training tokens), with the
speedrun techniques of issue 33 added to the Transformer.

Every row trains with the demo's settings (``attnlab demo``: pydoc, character level, windows of
64, batches of 12, seed 0 or ``--seeds``) for ``--steps`` optimizer steps on one thread (steps, not a time
budget: the losses do not depend on how busy the machine is, and every model reads the same
tokens). The Transformer is the budget rule's row ``xs`` (2 x 64, RoPE, lr 4e-3, warm-up 50)
with a row's changes to its model or training config; the LSTM is the demo's (1 layer, 256,
lr 1e-2, warm-up 20). Scored as the demo scores: the mean cross-entropy on the whole held-out
split (nats/char). Each row's training time is printed too; it is a wall-clock, so only rows run
back to back on an idle machine compare.

    python benchmarks/demo_recipes.py --steps 800
    python benchmarks/demo_recipes.py --steps 800 --only lstm base muon muon+value_embeds
    python benchmarks/demo_recipes.py --steps 1611 --seeds 0 1 2 --only lstm muon+lr=0.02 \
        muon+lr=0.02+token_shift
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from attnlab.config import LMTaskConfig, ModelConfig
from attnlab.models.lm import DecoderLM
from attnlab.models.rnn_lm import LSTMLM, LSTMConfig
from attnlab.runspec.budget import ROWS
from attnlab.tasks.lm import LMTask
from attnlab.train import TrainConfig, train

#: row -> (ModelConfig changes, TrainConfig changes) of the demo's Transformer (row xs); a
#: ``model`` change ``"row": "s"`` takes the budget rule's row s (4 x 128, lr 4e-3, warm-up 100)
_MUON = {"optimizer": "muon"}
_VE = {"value_embeds": 1}
RECIPES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "base": ({}, {}),
    "muon": ({}, _MUON),
    "relu2": ({"activation": "relu2"}, {}),
    "value_embeds": (_VE, {}),
    "unet_skips": ({"unet_skips": True}, {}),
    "muon+relu2": ({"activation": "relu2"}, _MUON),
    "muon+value_embeds": (_VE, _MUON),
    "muon+relu2+value_embeds": ({**_VE, "activation": "relu2"}, _MUON),
    "muon+value_embeds+untied": ({**_VE, "tie_embeddings": False}, _MUON),
    "muon+value_embeds+unet_skips": ({**_VE, "unet_skips": True}, _MUON),
    "muon+value_embeds+muon_lr=0.04": (_VE, {**_MUON, "muon_lr": 0.04}),
    "muon+value_embeds+muon_lr=0.01": (_VE, {**_MUON, "muon_lr": 0.01}),
    "row_s+muon+value_embeds=2": ({"row": "s", "value_embeds": 2}, _MUON),
    "muon+value_embeds+compile": (_VE, {**_MUON, "compile": True}),
    "d96+muon+value_embeds": ({**_VE, "d_model": 96}, _MUON),
    "d128+muon+value_embeds": ({**_VE, "d_model": 128}, _MUON),
    "muon+value_embeds+lr=0.01": (_VE, {**_MUON, "lr": 0.01}),
    "muon+value_embeds+lr=0.02": (_VE, {**_MUON, "lr": 0.02}),
    "muon+value_embeds+lr=0.03": (_VE, {**_MUON, "lr": 0.03}),
    "muon+value_embeds+lr=0.05": (_VE, {**_MUON, "lr": 0.05}),
    "muon+value_embeds+lr=0.02+muon_lr=0.04": (_VE, {**_MUON, "lr": 0.02, "muon_lr": 0.04}),
    "muon+value_embeds+lr=0.02+min_lr=0": (_VE, {**_MUON, "lr": 0.02, "min_lr_ratio": 0.0}),
    "muon+lr=0.02": ({}, {**_MUON, "lr": 0.02}),
    # the demo's Transformer since the speedrun table: Muon, AdamW part at 0.02, token shift
    "muon+lr=0.02+token_shift": ({"token_shift": True}, {**_MUON, "lr": 0.02}),
    "adamw+lr=0.02": ({}, {"lr": 0.02}),
    "muon+lr=0.03": ({}, {**_MUON, "lr": 0.03}),
    "muon+lr=0.02+muon_lr=0.01": ({}, {**_MUON, "lr": 0.02, "muon_lr": 0.01}),
    "row_s+muon": ({"row": "s"}, _MUON),
    "d96+muon+lr=0.02": ({"d_model": 96}, {**_MUON, "lr": 0.02}),
    "L3+muon+lr=0.02": ({"n_layers": 3}, {**_MUON, "lr": 0.02}),
    "row_s+muon+lr=0.02": ({"row": "s"}, {**_MUON, "lr": 0.02}),
    "muon+value_embeds+min_lr=0": (_VE, {**_MUON, "min_lr_ratio": 0.0}),
    "muon+value_embeds+warmup=10": (_VE, {**_MUON, "warmup_steps": 10}),
}
#: the demo's LSTM and its learning rate and warm-up
LSTM_PRESET, LSTM_LR, LSTM_WARMUP = "small", 1e-2, 20


def train_row(
    name: str,
    steps: int,
    task: LMTask,
    workdir: Path,
    max_time: float | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Train one row from ``seed`` (``steps`` steps, or for ``max_time`` seconds) and score it on
    the whole held-out split."""
    torch.manual_seed(seed)
    length: dict[str, Any] = dict(max_time=max_time) if max_time else dict(steps=steps)
    common = dict(**length, batch_size=12, seed=seed, device="cpu", progress=False)
    common.update(eval_every=10**9, eval_batches=0)  # no validation during training
    if name == "lstm":
        config = LSTMConfig.preset(LSTM_PRESET, vocab_size=task.vocab_size, max_seq_len=64)
        model = LSTMLM(config)
        cfg = TrainConfig(lr=LSTM_LR, warmup_steps=LSTM_WARMUP, **common)
    else:
        model_changes, train_changes = RECIPES[name]
        model_changes = dict(model_changes)
        row = ROWS[1] if model_changes.pop("row", "xs") == "s" else ROWS[0]  # xs: the demo's
        # without the token shift the rule's rows have now, as these rows were measured
        plain = {**row.model_fields(), "token_shift": False}
        fields = {**plain, "vocab_size": task.vocab_size, **model_changes}
        model = DecoderLM(ModelConfig.from_dict(fields))
        cfg = TrainConfig(**{"lr": row.lr, "warmup_steps": row.warmup_steps, **common,
                             **train_changes})  # fmt: skip
    t0 = time.time()
    folder = "".join(ch if ch.isalnum() else "_" for ch in name)
    tag = (f"{max_time:g}s" if max_time else f"{steps}") + (f"_seed{seed}" if seed else "")
    result = train(model, task, cfg, workdir / f"{folder}_{tag}", overwrite=True)
    seconds = time.time() - t0
    loss = task.val_loss(model, batch_size=32)["loss"]
    n = result.steps
    row = {"name": name, "steps": n, "tokens": n * 12 * 64, "val_loss": loss, "s": seconds}
    return {**row, "seed": seed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=800, help="optimizer steps of every row")
    ap.add_argument(
        "--max-time", type=float, default=None, help="seconds of training per row (not steps)"
    )
    names = ["lstm", *RECIPES]
    ap.add_argument("--only", nargs="+", choices=names, default=names, help="these rows only")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="every row at these seeds")
    ap.add_argument("--workdir", default="runs/demo_recipes")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    torch.set_num_threads(1)  # as the demo's LSTM; and the losses then repeat exactly
    task = LMTask.build(LMTaskConfig(data="pydoc", tokenizer="char", seq_len=64, seed=0))
    rows = []
    for seed in args.seeds:
        for name in args.only:
            rows.append(train_row(name, args.steps, task, Path(args.workdir), args.max_time, seed))
            print(json.dumps(rows[-1]), flush=True)
    length = f"{args.max_time:g} s" if args.max_time else f"{args.steps} steps"
    print(f"\nthe demo's settings, {length} each, 1 thread\n")
    print("| row | seed | steps | tokens | val loss (whole split) | training time |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['name']} | {r['seed']} | {r['steps']} | {r['tokens']:,} | {r['val_loss']:.4f} "
            f"| {r['s']:.0f} s |"
        )
    if len(args.seeds) > 1:
        print("\nmean over the seeds:")
        for name in args.only:
            losses = [r["val_loss"] for r in rows if r["name"] == name]
            print(f"  {name:<40}{sum(losses) / len(losses):.4f}")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
