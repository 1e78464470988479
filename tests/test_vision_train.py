"""End to end: a tiny ViT learns the 8×8 digits far above chance in a short CPU run."""

from __future__ import annotations

import pytest
import torch

from attnlab.config.vision import ViTConfig
from attnlab.data.images import load_digits
from attnlab.models.vision import VisionTransformer
from attnlab.tasks.image import ImageClassificationTask
from attnlab.train import TrainConfig, train


@pytest.mark.slow
def test_tiny_vit_learns_digits(tmp_path):
    task = ImageClassificationTask(load_digits(), seed=0)
    model = VisionTransformer(ViTConfig.preset("tiny"))
    cfg = TrainConfig(
        steps=250,
        batch_size=64,
        lr=1e-3,
        warmup_steps=25,
        weight_decay=0.05,
        eval_every=250,
        eval_batches=3,
        progress=False,
    )
    result = train(model, task, cfg, tmp_path / "run")
    acc, loss = task.test_accuracy(model)
    # 10 balanced classes: chance is 0.1 and a log-loss of ln 10 ≈ 2.30
    assert acc > 0.7, acc
    assert loss < 1.0 and result.final_train_loss < 1.0
    assert torch.isfinite(torch.tensor(result.best_val_loss))
