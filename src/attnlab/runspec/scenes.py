"""The scene families of :func:`attnlab.runspec.resolve`: image captioning (``attnlab train
caption``) and visual question answering (``attnlab train vqa``) on generated scenes.

Settings merge as for every kind (flag defaults < config file, or on a resume the run's
config.json < typed flags < ``--set``). The model starts from its preset, then the other model
keys; the vocabulary and the image size (and VQA's number of answers) come from the task. The
task's seed follows the training's unless set.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from attnlab.config import ConfigError
from attnlab.config.base import Config
from attnlab.config.multimodal import CaptionConfig, VQAConfig
from attnlab.config.train import TrainConfig
from attnlab.models.multimodal.captioner import build_captioner
from attnlab.models.multimodal.vqa import build_vqa
from attnlab.runspec.spec import Family, Given, RunSpec
from attnlab.tasks.caption import CaptionTask, CaptionTaskConfig
from attnlab.tasks.scenes import SceneTask
from attnlab.tasks.vqa import VQATask, VQATaskConfig

__all__ = ["CAPTION", "VQA", "resolve_scene", "scene_model_config"]


def resolve_scene(fam: Family, given: Given) -> RunSpec:
    """The :class:`RunSpec` of a captioner or a VQA model (see :func:`attnlab.runspec.resolve`).

    The kind is the file's (or the run's), else the family's first; the model's ``arch`` picks
    the module when it is built.

    Raises:
        ConfigError: a file holding a run of another family; bad values.
    """
    sections = given.merged(given.base)
    kind = sections.get("kind", fam.kinds[0])
    if kind not in fam.kinds:
        raise ConfigError(f"--config holds a {kind!r} run; this command trains {list(fam.kinds)}")
    train = TrainConfig.from_dict(sections["train"])
    task = dict(sections["task"])
    task.setdefault("seed", train.seed)
    task.setdefault("n_unseen", 100)
    return RunSpec(
        fam,
        kind,
        dict(sections["model"]),
        train,
        fam.task_cls.from_dict(task),
        typed=frozenset(given.flags),
        resume=given.resume,
        run_dir=given.run_dir,
    )


def scene_model_config(cls: type[Config], section: Mapping[str, Any], **derived: Any) -> Config:
    """``cls`` from the model section (``preset`` first, then the other keys) and the values the
    data decide (vocabulary and image size)."""
    fields = {k: v for k, v in section.items() if k != "preset"}
    fields.update(derived)
    preset = section.get("preset")
    return cls.preset(preset, **fields) if preset else cls.from_dict(fields)


def _builder(
    config_cls: type[Config],
    build: Callable[[Any], nn.Module],
    **per_task: Callable[[Any], Any],
) -> Callable[[RunSpec], tuple[nn.Module, SceneTask]]:
    """``build(spec) -> (model, task)``: the task's scenes, then the seeded model.

    Args:
        per_task: model fields the task decides besides the vocabulary and image size, as
            functions of the task (``n_answers`` of VQA).
    """

    def build_scene_run(spec: RunSpec) -> tuple[nn.Module, SceneTask]:
        task = spec.family.task_type(spec.task)
        derived = {k: f(task) for k, f in per_task.items()}
        derived.update(vocab_size=len(task.vocab), image_size=task.config.scene.image_size)
        config = scene_model_config(config_cls, spec.model, **derived)
        torch.manual_seed(spec.train.seed)  # the same weights for the same settings
        model = build(config)
        spec.kind = getattr(model, "kind", spec.kind)  # the arch's kind (caption_lstm, ...)
        return model, task

    return build_scene_run


CAPTION = Family(
    "caption",
    "captioner",
    ("caption_lstm", "caption_transformer", "caption_prefix"),
    CaptionTaskConfig,
    CaptionTask,
    {},
    kind_flag="--model",
    resolver=resolve_scene,
    builder=_builder(CaptionConfig, build_captioner),
)
VQA = Family(
    "vqa",
    "VQA model",
    ("vqa_lstm", "vqa_transformer"),
    VQATaskConfig,
    VQATask,
    {},
    kind_flag="--model",
    resolver=resolve_scene,
    builder=_builder(
        VQAConfig,
        build_vqa,
        n_answers=lambda t: len(t.vocab.answers),
        answer_ids=lambda t: [t.vocab.stoi[a] for a in t.vocab.answers],
    ),
)
