"""A fixed set of scenes of one split: layouts, images, captions and questions.

Shape legend: N scenes, H = W image size.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from attnlab.data.scenes.captions import scene_captions
from attnlab.data.scenes.questions import scene_questions
from attnlab.data.scenes.render import render_scene
from attnlab.data.scenes.world import SPLITS, SceneConfig, generate_scene
from attnlab.fileio import atomic_save, atomic_write_text

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

    def write_samples(self, out: str | Path) -> list[list[str]]:
        """Write ``scene_K.png`` (and an 8x enlarged ``scene_K_x8.png``), ``scene_K.json`` (the
        objects, reference captions and every question with its answer) and ``scene_K.txt``
        into ``out`` (created; files in it are replaced).

        Returns:
            Each scene's text lines: a header, ``captions:``, the captions, ``questions:``, one
            ``[type] question -> answer`` line each.
        """
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        texts = []
        for k, scene in enumerate(self.scenes):
            img = self.images[k]
            big = np.kron(img, np.ones((8, 8, 1), dtype=np.uint8))
            for name, im in ((f"scene_{k}.png", img), (f"scene_{k}_x8.png", big)):
                atomic_save(
                    out / name, lambda tmp, im=im: Image.fromarray(im).save(tmp, format="PNG")
                )
            info = {
                "objects": [
                    {"colour": o.colour, "shape": o.shape, "x": round(o.x, 1), "y": round(o.y, 1)}
                    for o in scene.objects
                ],
                "captions": self.captions[k],
                "questions": [
                    {"type": q.qtype, "question": q.question, "answer": q.answer}
                    for q in self.questions[k]
                ],
            }
            atomic_write_text(out / f"scene_{k}.json", json.dumps(info, indent=1) + "\n")
            lines = (
                [f"scene_{k}.png ({self.split} split, {len(scene.objects)} objects)", "captions:"]
                + [f"  {c}" for c in self.captions[k]]
                + ["questions:"]
                + [f"  [{q.qtype}] {q.question} -> {q.answer}" for q in self.questions[k]]
            )
            atomic_write_text(out / f"scene_{k}.txt", "\n".join(lines) + "\n")
            texts.append(lines)
        return texts
