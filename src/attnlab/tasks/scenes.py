"""What the captioning and VQA tasks share: their config, scene sets per split, batch seeds.

Batches depend only on ``(task seed, split, step, rank)``, as the trainer's resume needs.

Shape legend: B batch, L token length.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from attnlab.attention.capture import collect_aux_losses
from attnlab.config.base import Config, ConfigError
from attnlab.data.scenes import SPLITS, SceneConfig, SceneSet, Vocab, build_vocab, images_to_tensor
from attnlab.errors import UserError

__all__ = [
    "SceneTaskConfig",
    "SceneTask",
    "batch_rng",
    "pad_ids",
    "forward_with_aux",
    "with_aux",
]


@dataclass
class SceneTaskConfig(Config):
    """Data settings of a scene task (config.json's ``"task"``).

    Attributes:
        scene: how scenes are drawn (:class:`~attnlab.data.scenes.SceneConfig`).
        n_train, n_val, n_unseen: scenes per split.
        seed: seed of the scenes and of the batches.
    """

    #: the first release wrote the task's name next to its settings
    IGNORED: ClassVar[frozenset[str]] = frozenset({"name"})

    scene: SceneConfig = field(default_factory=SceneConfig)
    n_train: int = 4000
    n_val: int = 300
    n_unseen: int = 300
    seed: int = 0

    def validate(self) -> None:
        super().validate()
        self.positive("n_train", "n_val", "n_unseen")


def batch_rng(seed: int, split: str, step: int, rank: int = 0) -> np.random.Generator:
    """The random generator of batch ``step`` of ``split`` on ``rank``."""
    return np.random.default_rng([seed, SPLITS[split], step, rank])


def pad_ids(seqs: list[list[int]], pad: int = Vocab.PAD) -> Tensor:
    """Right-pad id lists into ``(B, L_max)``."""
    out = torch.full((len(seqs), max(len(s) for s in seqs)), pad, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def with_aux(
    loss: Tensor, aux: Tensor | None, metrics: dict[str, float]
) -> tuple[Tensor, dict[str, float]]:
    """``loss`` plus the weighted MoE loss ``aux`` of :func:`forward_with_aux` (and ``aux`` in
    ``metrics``); ``(loss, metrics)`` unchanged when there is none."""
    if aux is None:
        return loss, metrics
    return loss + aux, {**metrics, "aux": float(aux.detach())}


def forward_with_aux(model: nn.Module, *inputs: Tensor) -> tuple[Tensor, Tensor | None]:
    """``model(*inputs)`` and its weighted mixture-of-experts load-balancing loss (None without
    MoE layers): ``moe_aux_coef`` × the losses the layers reported."""
    with collect_aux_losses() as aux:
        out = model(*inputs)
    if not aux.losses:
        return out, None
    base = getattr(model, "module", model)  # DistributedDataParallel keeps the model in .module
    coef = getattr(getattr(base, "config", None), "moe_aux_coef", 0.0)
    return out, coef * aux.total().to(out.device)


class SceneTask:
    """Base of :class:`~attnlab.tasks.caption.CaptionTask` and :class:`~attnlab.tasks.vqa.VQATask`.

    Args:
        config: the task config; or its fields as keywords (``CaptionTask(n_train=500)``).

    Attributes:
        config: the task config; vocab: the scene vocabulary.
    """

    config_cls: ClassVar[type[SceneTaskConfig]] = SceneTaskConfig

    def __init__(self, config: SceneTaskConfig | None = None, **fields: Any) -> None:
        if config is None:
            config = self.config_cls(**fields)
        elif fields:
            config = config.replace(**fields)
        self.config = config
        self.vocab = build_vocab()
        self._sets: dict[str, SceneSet] = {}

    @classmethod
    def for_run(cls, section: dict[str, Any], run_dir: str | Path) -> SceneTask:
        """The task a run was trained on, from its config.json's ``task`` section.

        Raises:
            UserError: settings that do not fit this task (named, with the run's directory).
        """
        try:
            return cls(cls.config_cls.from_dict(section))
        except ConfigError as err:
            raise UserError(f"{run_dir}/config.json: task settings do not fit: {err}") from None

    def sets(self, split: str) -> SceneSet:
        """The scenes of ``split`` (generated on first use)."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; choose from {list(SPLITS)}")
        if split not in self._sets:
            c = self.config
            n = {"train": c.n_train, "val": c.n_val, "unseen": c.n_unseen}[split]
            self._sets[split] = SceneSet(c.scene, split, n, c.seed)
        return self._sets[split]

    def rng(self, split: str, step: int, rank: int = 0) -> np.random.Generator:
        return batch_rng(self.config.seed, split, step, rank)

    def caption_batch(
        self, sset: SceneSet, idx: np.ndarray, rng: np.random.Generator, *, listing: bool = False
    ) -> dict[str, Tensor]:
        """Scenes ``idx`` of ``sset`` with one caption each: ``{"images": (B, 3, H, W),
        "tokens": (B, L)}`` (``<start> words <end>``, right-padded); the caption is the listing
        one (the first) or, by default, one of the scene's references drawn with ``rng``."""
        if listing:
            caps = [sset.captions[i][0] for i in idx]
        else:
            caps = [sset.captions[i][rng.integers(len(sset.captions[i]))] for i in idx]
        tokens = pad_ids([self.vocab.encode_caption(c) for c in caps])  # (B, L)
        return {"images": images_to_tensor(sset.images[idx]), "tokens": tokens}

    def val_indices(
        self, size: int, n_batches: int
    ) -> Iterator[tuple[np.ndarray, np.random.Generator]]:
        """The fixed validation batches: ``n_batches`` runs of ``size`` consecutive scenes
        (wrapping around), each with the generator of its batch."""
        n = len(self.sets("val"))
        for b in range(n_batches):
            yield (np.arange(size) + b * size) % n, self.rng("val", b)

    @staticmethod
    def share(batch_size: int, world: int) -> int:
        """This rank's part of a global batch."""
        if batch_size % world:
            raise ValueError(f"batch_size {batch_size} is not divisible by world size {world}")
        return batch_size // world

    def config_dict(self) -> dict:
        return self.config.to_dict()

    def save_artifacts(self, run_dir: Path) -> None:
        self.vocab.save(Path(run_dir) / "vocab.json")

    def count(self, batch: dict) -> int:
        return int(batch["images"].shape[0])
