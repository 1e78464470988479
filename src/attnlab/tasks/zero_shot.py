"""``attnlab zero-shot``: image files classified by text prompts with a trained dual encoder.

Each image takes the prompt whose text embedding is closest to its image embedding (the scaled
cosine similarity, softmax over the prompts); without prompts, every colour-shape combination.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from attnlab.data.scenes import read_scene_image
from attnlab.tasks.clip import ClipTask, check_prompts, class_prompts

__all__ = ["zero_shot_files"]


def zero_shot_files(
    run: Any, images: Sequence[str], prompts: Sequence[str] | None, top: int
) -> list[list[tuple[str, float]]]:
    """Per image, its ``top`` (at least 1) most likely prompts with their probabilities, the
    best first (``run``: a loaded clip run).

    Raises:
        UserError: a prompt with no word the vocabulary knows, an unreadable image.
    """
    task = ClipTask.for_run(run.task, run.run_dir)
    prompts = list(prompts or class_prompts(task.config.scene))
    ids = check_prompts(run.tokenizer, prompts)
    size = run.model.config.image_size
    batch = torch.cat([read_scene_image(path, size) for path in images])
    with torch.no_grad():
        probs = run.model(batch, ids).softmax(-1)  # (B, K)
    out = []
    for row in probs:
        best = row.topk(max(1, min(top, len(prompts))))
        out.append([(prompts[int(i)], float(p)) for p, i in zip(*best)])
    return out
