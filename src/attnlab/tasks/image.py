"""Image classification for the shared trainer: batches of normalised (augmented) images, the
cross-entropy loss (DeiT's distillation loss once a teacher is attached: :meth:`use_teacher`),
accuracy, and the run's ``labels.json``.

    task = ImageClassificationTask.from_config(ImageTaskConfig(data="digits"), seed=0)
    train(model, task, TrainConfig(...), "runs/vit")

Shape legend: N images, B batch, C channels, H/W height/width, L classes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.attention.capture import collect_aux_losses
from attnlab.config.vision import ImageTaskConfig
from attnlab.data.images import (
    FLIP_OK,
    LABELS_FILE,
    ImageSettings,
    ImageSplits,
    load_image_data,
    normalize,
    random_crop,
    random_flip,
)
from attnlab.errors import RunDirError
from attnlab.fileio import atomic_write_text
from attnlab.metrics.classification import accuracy, evaluate_classifier, per_class_accuracy
from attnlab.tasks.distill import Teacher
from attnlab.tasks.losses import cross_entropy, distillation_loss

__all__ = ["ImageClassificationTask", "load_task_data"]


def load_task_data(config: ImageTaskConfig, seed: int) -> ImageSplits:
    """The splits an :class:`ImageTaskConfig` describes (split with ``seed``).

    Raises:
        UserError: a missing path, an unreadable file, an unknown source.
    """
    sizes = ("image_size", "channels", "shapes_n", "shapes_label")  # same names in both
    return load_image_data(
        config.data,
        path=config.data_path,
        seed=seed,
        **{name: getattr(config, name) for name in sizes},
    )


class ImageClassificationTask:
    """Image classification: batches ``(images (B, C, H, W), labels (B,))``.

    Training batches walk through a fresh permutation of the training set every epoch (seeded by
    ``seed`` and the epoch), so a batch depends only on (seed, step) and resuming is exact.

    Args:
        data: the loaded splits.
        seed: batch order and augmentation seed.
        train_fraction: use only this fraction of the training set (a seeded, class-agnostic subset;
            the inductive-bias experiment grows it).
        augment: random crop (padding ``crop_padding``) and, where sensible, horizontal flips.
            None (default) = on for images of at least 16×16: on 8×8 digits a one-pixel shift
            moves an eighth of the image, which measurably hurts a small ViT.
        crop_padding: pixels of zero padding for the random crop (default ``max(1, H // 8)``).
        config: the data options the splits were loaded with (recorded in config.json; default:
            the source's defaults).

    Raises:
        ValueError: ``train_fraction`` outside (0, 1].
    """

    def __init__(
        self,
        data: ImageSplits,
        *,
        seed: int = 0,
        train_fraction: float = 1.0,
        augment: bool | None = None,
        crop_padding: int | None = None,
        config: ImageTaskConfig | None = None,
    ) -> None:
        if not 0.0 < train_fraction <= 1.0:
            raise ValueError(f"train_fraction must be in (0, 1], got {train_fraction}")
        self.data, self.seed = data, seed
        self.augment = bool(data.train[0].shape[-1] >= 16) if augment is None else bool(augment)
        self.train_fraction = train_fraction
        x, y = data.train
        if train_fraction < 1.0:
            keep = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed + 1))
            keep = keep[: max(1, round(train_fraction * len(y)))]
            x, y = x[keep], y[keep]
        self.train_x, self.train_y = x, y
        self.classes = list(data.classes)
        c = x.shape[1]
        self.mean = [float(v) for v in x.transpose(0, 1).reshape(c, -1).mean(1)]
        self.std = [max(float(v), 1e-3) for v in x.transpose(0, 1).reshape(c, -1).std(1)]
        self.flip = FLIP_OK.get(data.name, False)
        self.crop_padding = max(1, x.shape[-1] // 8) if crop_padding is None else crop_padding
        self.config = (config or ImageTaskConfig(data=data.name)).replace(
            train_fraction=train_fraction, augment=self.augment, crop_padding=self.crop_padding
        )
        self._perms: dict[int, Tensor] = {}
        #: the teacher a DeiT student learns from (None: plain cross-entropy)
        self.teacher: Teacher | None = None

    @classmethod
    def from_config(cls, config: ImageTaskConfig, seed: int) -> ImageClassificationTask:
        """Load the data ``config`` describes and build the task (batch and split seed ``seed``)."""
        return cls(
            load_task_data(config, seed),
            seed=seed,
            train_fraction=config.train_fraction,
            augment=config.augment,
            crop_padding=config.crop_padding,
            config=config,
        )

    @classmethod
    def for_run(cls, task: dict[str, Any], settings: ImageSettings) -> ImageClassificationTask:
        """The task of a trained run, to evaluate it: the same data and splits, no augmentation,
        exactly the training normalisation (from the run's :class:`ImageSettings`).

        Args:
            task: config.json's ``task`` section.
            settings: the run's ``labels.json`` (``attnlab.runs.load(run).tokenizer``).

        Raises:
            RunDirError: not an image-classification run.
        """
        if task.get("name") != "image":
            raise RunDirError(f"not an image-classification run (task {task.get('name')!r})")
        config = ImageTaskConfig.from_dict(task).replace(augment=False)
        out = cls.from_config(config, int(task.get("seed", 0)))
        out.mean, out.std = list(settings.mean), list(settings.std)
        return out

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.train_x.shape[1:])  # type: ignore[return-value]

    @property
    def settings(self) -> ImageSettings:
        """What the trained model needs to read new images (written as ``labels.json``)."""
        return ImageSettings(self.classes, self.image_shape, self.mean, self.std, self.data.name)

    def prepare(self, images: Tensor) -> Tensor:
        """Normalise raw [0, 1] images the way the model was trained."""
        return normalize(images, self.mean, self.std)

    def _perm(self, epoch: int) -> Tensor:
        if epoch not in self._perms:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perms = {epoch: torch.randperm(len(self.train_y), generator=g)}
        return self._perms[epoch]

    def get_batch(
        self, split: str, step: int, batch_size: int, rank: int = 0, world: int = 1
    ) -> tuple[Tensor, Tensor]:
        """Rank's share of global batch ``step`` of ``split`` (normalised; augmented if train)."""
        per_rank = batch_size // world
        if split == "train":
            n = len(self.train_y)
            pos = step * batch_size + rank * per_rank + torch.arange(per_rank)
            idx = torch.stack([self._perm(int(p) // n)[int(p) % n] for p in pos]) if n else pos
            x, y = self.train_x[idx], self.train_y[idx]
            if self.augment:
                g = torch.Generator().manual_seed((self.seed * 7919 + step) * 131 + rank)
                x = random_crop(x, self.crop_padding, g)
                if self.flip:
                    x = random_flip(x, g)
        else:
            xs, ys = self.data.split(split)
            g = torch.Generator().manual_seed(self.seed * 7919 + step)
            idx = torch.randint(0, len(ys), (batch_size,), generator=g)[
                rank * per_rank : (rank + 1) * per_rank
            ]
            x, y = xs[idx], ys[idx]
        return self.prepare(x), y

    def use_teacher(self, teacher: Teacher) -> None:
        """Distil from ``teacher`` (the student must be a DeiT): the loss becomes
        :func:`~attnlab.tasks.losses.distillation_loss` with the config's ``distillation``,
        ``distill_alpha`` and ``distill_temperature``.

        Raises:
            UserError: a teacher of another image shape or other classes (naming both).
        """
        teacher.check_student(self.image_shape, self.classes, what="the student's data")
        self.teacher = teacher

    def loss(
        self, model: nn.Module, batch: tuple[Tensor, Tensor], cfg: Any
    ) -> tuple[Tensor, dict[str, float]]:
        """Cross-entropy (with the run's label smoothing) — with a teacher, DeiT's distillation
        loss — plus ``moe_aux_coef`` × the MoE load-balancing loss of a mixture-of-experts model;
        accuracy (of the averaged heads, with a teacher) as a metric."""
        images, labels = batch
        smoothing = getattr(cfg, "label_smoothing", 0.0)
        metrics: dict[str, float] = {}
        if self.teacher is not None:  # (outside the student's auxiliary losses)
            z_teacher = self.teacher.logits(images, self.mean, self.std)  # (B, L)
        with collect_aux_losses() as aux:
            if self.teacher is None:
                logits = model(images)  # (B, L)
                loss = cross_entropy(logits.float(), labels, label_smoothing=smoothing)
            else:
                z_cls, z_dist = model(images, both_heads=True)  # (B, L) each
                c = self.config
                loss = distillation_loss(
                    z_cls,
                    z_dist,
                    labels,
                    z_teacher,
                    kind=c.distillation,
                    alpha=c.distill_alpha,
                    temperature=c.distill_temperature,
                    label_smoothing=smoothing,
                )
                logits = (z_cls + z_dist) / 2
                metrics["teacher_agree"] = accuracy(z_dist, z_teacher.argmax(-1))
        metrics["acc"] = accuracy(logits, labels)
        inner = getattr(model, "module", model)  # DDP / torch.compile wrap the model
        coef = getattr(getattr(inner, "config", None), "moe_aux_coef", 0.0)
        if aux.losses and coef:
            balance = aux.total().to(loss.device)
            loss = loss + coef * balance
            metrics["aux"] = float(balance.detach())
        return loss, metrics

    def eval_batches(self, batch_size: int, n_batches: int) -> Iterable[tuple[Tensor, Tensor]]:
        """The first ``n_batches × batch_size`` validation images, in order (fixed)."""
        x, y = self.data.val
        x = self.prepare(x)

        def it() -> Iterator[tuple[Tensor, Tensor]]:
            for i in range(n_batches):
                s = i * batch_size
                if s >= len(y):
                    break
                yield x[s : s + batch_size], y[s : s + batch_size]

        return list(it())

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Accuracy on the whole validation split."""
        device = next(model.parameters()).device
        acc, _ = evaluate_classifier(
            model, self.prepare(self.data.val[0]), self.data.val[1], device=device
        )
        return {"val_acc": acc}

    def test_accuracy(
        self, model: nn.Module, *, split: str = "test", device: str | torch.device = "cpu"
    ) -> tuple[float, float]:
        """``(accuracy, loss)`` on a whole split."""
        x, y = self.data.split(split)
        return evaluate_classifier(model, self.prepare(x), y, device=device)

    @torch.no_grad()
    def evaluate_split(
        self,
        model: nn.Module,
        *,
        split: str = "test",
        batch_size: int = 32,
        max_batches: int | None = None,
    ) -> dict[str, Any]:
        """What ``attnlab eval`` reports for a classifier: accuracy, loss and accuracy per class
        on ``split`` (its first ``max_batches`` batches of ``batch_size`` images, or all).

        Returns:
            ``{"accuracy", "loss", "correct", "n", "per_class"}`` (``per_class``: one accuracy per
            class, None for a class without an example).
        """
        x, y = self.data.split(split)
        if max_batches is not None:
            x, y = x[: max_batches * batch_size], y[: max_batches * batch_size]
        logits = torch.cat(
            [
                model(self.prepare(x[i : i + batch_size])).float()
                for i in range(0, len(y), batch_size)
            ]
        )
        pred = logits.argmax(-1)
        return {
            "accuracy": float((pred == y).float().mean()),
            "loss": float(torch.nn.functional.cross_entropy(logits, y)),
            "correct": int((pred == y).sum()),
            "n": len(y),
            "per_class": per_class_accuracy(pred, y, len(self.classes)),
        }

    def count(self, batch: tuple[Tensor, Tensor]) -> int:
        return int(batch[1].shape[0])

    def config_dict(self) -> dict:
        """config.json's ``task``: the :class:`ImageTaskConfig` plus what the task derived (the
        seed, flips, image shape, classes, normalisation, split sizes; dropped on reading)."""
        return {
            "name": "image",
            **self.config.to_dict(),
            "seed": self.seed,
            "flip": self.flip,
            "image_shape": list(self.image_shape),
            "classes": self.classes,
            "mean": self.mean,
            "std": self.std,
            "sizes": {s: len(self.data.split(s)[1]) for s in ("train", "val", "test")},
        }

    def save_artifacts(self, run_dir: Path) -> None:
        """``labels.json``: class names, image shape and normalisation (read by ``classify``)."""
        atomic_write_text(Path(run_dir) / LABELS_FILE, self.settings.to_json())
