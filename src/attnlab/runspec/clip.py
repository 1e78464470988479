"""The dual-encoder family of :func:`attnlab.runspec.resolve`: ``attnlab train clip`` on
generated scenes and their captions.

Settings merge as for the other scene families (:func:`attnlab.runspec.scenes.resolve_scene`).
The model starts from its preset, then the other model keys merged into it section by section
(``text.arch = "bow"`` changes one field of the text tower); the vocabulary (the text tower's
``vocab_size``, its end-of-text and padding ids) and the image size come from the task.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from attnlab.config.clip import ClipConfig, merge_nested
from attnlab.data.scenes import Vocab
from attnlab.models.multimodal.clip import DualEncoder
from attnlab.runspec.scenes import resolve_scene
from attnlab.runspec.spec import Family, RunSpec
from attnlab.tasks.clip import ClipTask, ClipTaskConfig

__all__ = ["CLIP", "clip_model_config"]


def clip_model_config(section: Mapping[str, Any], task: ClipTask) -> ClipConfig:
    """The :class:`ClipConfig` of a model section (``preset`` first, then the other keys) for
    ``task``'s vocabulary and image size."""
    fields = {k: v for k, v in section.items() if k != "preset"}
    derived = {
        "text": {"vocab_size": len(task.vocab), "eos_id": Vocab.END, "pad_id": Vocab.PAD},
        "vision": {"image_size": task.config.scene.image_size, "in_channels": 3},
    }
    fields = merge_nested(fields, derived)
    preset = section.get("preset")
    return ClipConfig.preset(preset, **fields) if preset else ClipConfig.from_dict(fields)


def _build(spec: RunSpec) -> tuple[DualEncoder, ClipTask]:
    task = ClipTask(spec.task)
    config = clip_model_config(spec.model, task)
    torch.manual_seed(spec.train.seed)  # the same weights for the same settings
    return DualEncoder(config), task


CLIP = Family(
    "clip",
    "dual encoder",
    ("clip",),
    ClipTaskConfig,
    ClipTask,
    {},
    resolver=resolve_scene,
    builder=_build,
)
