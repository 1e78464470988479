"""What the scene experiments (vqa-bias, caption-retrieval, caption-features) share: their
settings, how each model is trained, and the encoder pre-training of ``caption-features`` (also
``attnlab train caption --pretrain-steps``).

Every model of an experiment gets the same budget and the same trainer settings, so that their
scores differ by architecture only: the experiment's steps (or seconds), batch size and learning
rate, a 50-step warm-up, no weight decay, and one validation at the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from attnlab.config.base import Config
from attnlab.data.scenes import SceneSet, images_to_tensor, shape_label
from attnlab.errors import RunDirError
from attnlab.experiments.training import train_settings
from attnlab.models.multimodal.encoders import ImageEncoder
from attnlab.tasks.losses import cross_entropy
from attnlab.tasks.scenes import SceneTask
from attnlab.train import TrainResult, train

__all__ = ["SceneExperimentConfig", "check_fresh", "train_for_experiment", "pretrain_encoder"]


@dataclass
class SceneExperimentConfig(Config):
    """Settings every scene experiment has (each model gets the same budget).

    Attributes:
        out: directory of the experiment's runs and ``results.json``.
        steps, max_time: training length per model (``max_time`` seconds win when set).
        batch_size, lr: the trainer's batch size and peak learning rate.
        preset: model size (``tiny`` or ``small``).
        n_train: training scenes.
        seed: seed of the scenes, the initialisations and the batches.
        device, progress: where to train, whether to show a progress bar.
        overwrite: replace the runs an earlier experiment left in ``out``.
    """

    out: str = "runs/scenes"
    steps: int = 800
    max_time: float | None = None
    batch_size: int = 64
    lr: float = 3e-3
    preset: str = "tiny"
    n_train: int = 2000
    seed: int = 0
    device: str = "auto"
    progress: bool = True
    overwrite: bool = False

    def validate(self) -> None:
        super().validate()
        self.positive("steps", "max_time", "batch_size", "lr", "n_train")


def check_fresh(out: str | Path, names: list[str], overwrite: bool) -> None:
    """Refuse, before any work, to train into runs an earlier experiment left in ``out``.

    Raises:
        RunDirError: ``out/NAME`` holds files for one of ``names`` and ``overwrite`` is false.
    """
    taken = [n for n in names if (Path(out) / n).is_dir() and any((Path(out) / n).iterdir())]
    if taken and not overwrite:
        raise RunDirError(
            f"{str(out)!r} already holds this experiment's runs ({', '.join(taken)}); pass "
            "--overwrite to train them again, or choose another --out"
        )


def train_for_experiment(
    model: nn.Module, task: SceneTask, cfg: SceneExperimentConfig, run_dir: str | Path
) -> TrainResult:
    """Train ``model`` on ``task`` into ``run_dir`` with the experiment's budget.

    Args:
        model: the model to train (in place).
        task: a :class:`~attnlab.tasks.caption.CaptionTask` or :class:`~attnlab.tasks.vqa.VQATask`.
        cfg: the experiment's settings.
        run_dir: where the run is saved (replaced when ``cfg.overwrite``).
    """
    tcfg = train_settings(  # validate once, at the end
        cfg,
        steps=cfg.steps,
        max_time=cfg.max_time,
        lr=cfg.lr,
        warmup_steps=50,
        weight_decay=0.0,
        eval_batches=2,
    )
    return train(model, task, tcfg, run_dir, overwrite=cfg.overwrite)


def pretrain_encoder(
    encoder: ImageEncoder,
    sset: SceneSet,
    steps: int,
    *,
    batch_size: int = 64,
    lr: float = 2e-3,
    seed: int = 0,
) -> float:
    """Train ``encoder`` as a classifier of :func:`~attnlab.data.scenes.shape_label` (the
    majority shape, the "ImageNet classifier" of the lecture at toy scale) on the first 80 % of
    the scenes of ``sset``.

    The point is a classifier whose logits know "which class" and little else; the captioning
    experiment then reads either those logits or the penultimate features. Every encoder weight
    trains (the head too, even if the captioner will not read it); which ones the captioner
    trains afterwards is restored.

    Returns:
        The accuracy on the last 20 % of the scenes (held out from this training).
    """
    labels = torch.tensor([shape_label(s) for s in sset.scenes])
    n_fit = max(1, int(0.8 * len(sset)))
    rng = np.random.default_rng(seed)
    device = next(encoder.parameters()).device
    trainable = {n: p.requires_grad for n, p in encoder.named_parameters()}
    encoder.requires_grad_(True)
    opt = torch.optim.AdamW(encoder.parameters(), lr=lr, weight_decay=0.0)
    encoder.net.train()  # batch-norm statistics learn here, even for an encoder frozen later
    for _ in range(steps):
        idx = rng.integers(n_fit, size=batch_size)
        x = images_to_tensor(sset.images[idx]).to(device)
        loss = cross_entropy(encoder.logits(x), labels[idx].to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    for n, p in encoder.named_parameters():
        p.requires_grad_(trainable[n])
    encoder.eval()
    with torch.no_grad():
        idx = np.arange(n_fit, len(sset)) if n_fit < len(sset) else np.arange(len(sset))
        pred = encoder.logits(images_to_tensor(sset.images[idx]).to(device)).argmax(-1).cpu()
    return float((pred == labels[idx]).float().mean())
