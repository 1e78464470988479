"""A fixed set of scenes of one split: layouts, images, captions and questions.

Shape legend: N scenes, H = W image size.
"""

from __future__ import annotations

import numpy as np

from attnlab.data.scenes.captions import scene_captions
from attnlab.data.scenes.questions import scene_questions
from attnlab.data.scenes.render import render_scene
from attnlab.data.scenes.world import SPLITS, SceneConfig, generate_scene

__all__ = ["MAX_SCENE_BYTES", "SceneSet"]

MAX_SCENE_BYTES = 2**32  # 4 GiB of rendered images: ~1.4 million scenes of 32x32


class SceneSet:
    """``n`` scenes of one split, generated once from ``(seed, split)``.

    Attributes:
        scenes: the layouts; images: ``uint8 (N, H, W, 3)``; captions: reference captions per
        scene; questions: every unambiguous :class:`~attnlab.data.scenes.questions.QA` per scene.

    Raises:
        ValueError: ``n < 1``, an unknown split, or images over :data:`MAX_SCENE_BYTES`.
    """

    def __init__(self, cfg: SceneConfig, split: str, n: int, seed: int = 0) -> None:
        if n < 1:
            raise ValueError(f"need at least one scene, got n={n}")
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; choose from {list(SPLITS)}")
        size = n * cfg.image_size**2 * 3  # the images are rendered up front, uint8 RGB
        if size > MAX_SCENE_BYTES:
            raise ValueError(
                f"{n:,} scenes of {cfg.image_size}x{cfg.image_size} pixels take "
                f"{size / 2**30:,.1f} GiB in memory, more than {MAX_SCENE_BYTES / 2**30:.0f} "
                "GiB: ask for fewer or smaller scenes"
            )
        rng = np.random.default_rng([seed, SPLITS[split]])
        self.config, self.split = cfg, split
        self.scenes = [generate_scene(rng, cfg, split) for _ in range(n)]
        self.images = np.stack([render_scene(s) for s in self.scenes])  # (N, H, W, 3)
        self.captions = [scene_captions(s) for s in self.scenes]
        self.questions = [scene_questions(s, cfg.margin) for s in self.scenes]

    def __len__(self) -> int:
        return len(self.scenes)

    def caption_set(self) -> set[str]:
        """Every reference caption of every scene."""
        return {c for caps in self.captions for c in caps}
