"""The shared trainer on a toy classification task: run directory, resume, divergence, budget.

The toy task and model here (``ToyTask``, ``ToyModel``) are also used by the other
``test_train_*`` files and by the torchrun script of the distributed test.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

from attnlab.errors import RunDirError, UserError
from attnlab.runs import atomic_write_text
from attnlab.train import TrainConfig, TrainingDiverged, cross_entropy, train

# ---------------------------------------------------------------------------------------------
# toy model and task


@dataclass
class ToyConfig:
    d_in: int = 8
    d_hidden: int = 16
    n_classes: int = 4
    dropout: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


class ToyModel(nn.Module):
    """Linear -> LayerNorm -> GELU -> Dropout -> Linear: weights, biases and a norm."""

    kind = "toy_mlp"

    def __init__(self, config: ToyConfig):
        super().__init__()
        self.config = config
        self.fc1 = nn.Linear(config.d_in, config.d_hidden)
        self.norm = nn.LayerNorm(config.d_hidden)
        self.drop = nn.Dropout(config.dropout)
        self.fc2 = nn.Linear(config.d_hidden, config.n_classes)

    def forward(self, x):
        return self.fc2(self.drop(torch.nn.functional.gelu(self.norm(self.fc1(x)))))


class ToyTask:
    """Classify x ~ N(0, I) by argmax of a fixed random linear teacher; batches from (seed, step).

    ``nan_at`` poisons the loss of that optimizer step's batch; ``interrupt_at`` raises
    KeyboardInterrupt when the batch of that step is requested; ``delay`` sleeps per batch.
    """

    def __init__(self, seed: int = 0, d_in: int = 8, n_classes: int = 4, nan_at: int | None = None,
                 interrupt_at: int | None = None, delay: float = 0.0):
        self.seed, self.d_in, self.n_classes = seed, d_in, n_classes
        self.teacher = torch.randn(d_in, n_classes, generator=torch.Generator().manual_seed(seed))
        self.nan_at, self.interrupt_at, self.delay = nan_at, interrupt_at, delay
        self.grad_accum = 1  # set by tests that use accumulation with nan_at / interrupt_at
        self.saved_to: Path | None = None

    def _make(self, split: str, index: int, n: int):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + (split == "val") * 7919 + index)
        x = torch.randn(n, self.d_in, generator=g)
        y = (x @ self.teacher).argmax(-1)
        return x, y

    def get_batch(self, split, step, batch_size, rank=0, world=1):
        if self.interrupt_at is not None and step // self.grad_accum == self.interrupt_at:
            raise KeyboardInterrupt
        if self.delay:
            import time

            time.sleep(self.delay)
        x, y = self._make(split, step, batch_size)
        share = batch_size // world
        sl = slice(rank * share, (rank + 1) * share)
        poison = torch.tensor(float("nan") if step // self.grad_accum == self.nan_at else 1.0)
        return {"x": x[sl], "y": y[sl], "poison": poison}

    def loss(self, model, batch, cfg):
        logits = model(batch["x"])
        loss = cross_entropy(logits, batch["y"], label_smoothing=cfg.label_smoothing)
        acc = (logits.argmax(-1) == batch["y"]).float().mean()
        return loss * batch["poison"], {"acc": acc}

    def eval_batches(self, batch_size, n_batches):
        for i in range(n_batches):
            x, y = self._make("val", i, batch_size)
            yield {"x": x, "y": y, "poison": torch.tensor(1.0)}

    def count(self, batch):
        return len(batch["y"])

    def config_dict(self):
        return {"name": "toy", "seed": self.seed}

    def save_artifacts(self, run_dir):
        self.saved_to = Path(run_dir)
        atomic_write_text(Path(run_dir) / "labels.json", json.dumps(list(range(self.n_classes))))


def make_model(seed: int = 0, dropout: float = 0.0) -> ToyModel:
    torch.manual_seed(seed)
    return ToyModel(ToyConfig(dropout=dropout))


def base_cfg(**kw) -> TrainConfig:
    values = dict(steps=12, batch_size=16, lr=3e-2, warmup_steps=3, eval_every=6, eval_batches=2,
                  log_every=1, progress=False, device="cpu")
    values.update(kw)
    return TrainConfig(**values)


def train_losses(result) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in result.history if "loss" in r]


# ---------------------------------------------------------------------------------------------
# tests


def test_run_directory_contents_and_learning(tmp_path):
    """A run writes config, last/best weights, state, metrics, curve, artifacts; the loss drops."""
    task = ToyTask()
    res = train(make_model(), task, base_cfg(steps=30, eval_every=10), tmp_path / "run")
    d = res.run_dir
    names = sorted(p.name for p in d.iterdir())
    assert names == ["best.safetensors", "config.json", "labels.json", "loss.png",
                     "metrics.jsonl", "model.safetensors", "state.pt"]
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["kind"] == "toy_mlp" and cfg["model"] == ToyConfig().to_dict()
    assert cfg["train"]["steps"] == 30 and cfg["task"] == {"name": "toy", "seed": 0}
    records = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    assert records == res.history
    train_recs = [r for r in records if "loss" in r]
    val_recs = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in train_recs] == list(range(1, 31))
    assert [r["step"] for r in val_recs] == [10, 20, 30]
    assert {"lr", "grad_norm", "acc", "tokens_per_s", "tokens", "elapsed"} <= set(train_recs[0])
    assert train_recs[-1]["tokens"] == 30 * 16
    assert res.steps == 30 and res.val_loss == val_recs[-1]["val_loss"]
    assert res.best_val_loss == min(r["val_loss"] for r in val_recs)
    assert res.val_loss < val_recs[0]["val_loss"] < math.log(4)
    assert (d / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(d.glob(".*"))  # atomic writes leave no temporary files behind
