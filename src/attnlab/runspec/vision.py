"""The image-classifier family of :func:`attnlab.runspec.resolve` (``attnlab train image``):
ViT, DeiT, Swin and a residual CNN on an image data set (a DeiT may name a teacher run).

Settings merge as for every kind (flag defaults < config file, or the resumed run's config.json <
typed flags < ``--set``); a typed kind must match the file's or the run's. The model starts from
its preset (``tiny`` for images of at most 16 px, ``small`` above, when none is named); the image
shape and the classes come from the data.
"""

from __future__ import annotations

import torch
from torch import nn

from attnlab.config.train import TrainConfig
from attnlab.config.vision import ImageTaskConfig
from attnlab.errors import UserError
from attnlab.models.vision.factory import build_image_classifier
from attnlab.runspec.spec import Family, Given, RunSpec
from attnlab.tasks.image import ImageClassificationTask

__all__ = ["IMAGE", "VISION_KINDS", "resolve_image", "build_image"]

VISION_KINDS = ("vit", "deit", "swin", "cnn")
#: model and task fields that only some architectures have
_ONLY_FOR = {
    "model.patch_size": ("vit", "deit", "swin"),
    "model.window_size": ("swin",),
    "model.pooling": ("vit",),
    "model.position": ("vit", "deit"),
    "task.teacher": ("deit",),
}


def resolve_image(fam: Family, given: Given) -> RunSpec:
    """The :class:`RunSpec` of an image classifier (see :func:`attnlab.runspec.resolve`).

    Raises:
        UserError: a typed kind that contradicts the file's (or the run's), a kind that is not
            an image classifier, a model option another architecture's or a teacher for a
            student that is not a DeiT (named by its flag).
    """
    typed = given.flags.get("kind")
    sections = given.merged(given.base)
    stored = sections.pop("kind", None)
    if typed and stored and typed != stored:
        source = (
            f"the run in {given.run_dir!r}" if given.resume is not None else repr(given.config_file)
        )
        raise UserError(
            f"--model {typed}, but {source} holds a {stored!r} model; drop --model, or start "
            "from another config"
        )
    kind = typed or stored or fam.kinds[0]
    if kind not in fam.kinds:
        raise UserError(f"{kind!r} is not an image classifier ({', '.join(fam.kinds)})")
    values = {**given.defaults, **given.flags}  # the flags' values: a file may hold any field
    values.update({f"task.{k}": v for k, v in sections["task"].items() if k == "teacher"})
    for key, kinds in _ONLY_FOR.items():
        if values.get(key) is not None and kind not in kinds:
            name = key.partition(".")[2]
            raise UserError(
                f"--{name.replace('_', '-')} applies to --model {' or '.join(kinds)} only "
                f"(got --model {kind})"
            )
    return RunSpec(
        fam,
        kind,
        dict(sections["model"]),
        TrainConfig.from_dict(sections["train"]),
        ImageTaskConfig.from_dict(sections["task"]),
        typed=frozenset(given.flags),
        resume=given.resume,
        run_dir=given.run_dir,
    )


def build_image(spec: RunSpec) -> tuple[nn.Module, ImageClassificationTask]:
    """Read the images and build the seeded classifier of ``spec`` (its preset, then the other
    model fields)."""
    task = ImageClassificationTask.from_config(spec.task, spec.train.seed)
    fields = dict(spec.model)
    preset = fields.pop("preset", None)
    torch.manual_seed(spec.train.seed)
    model = build_image_classifier(
        spec.kind, task.image_shape, task.classes, preset=preset, overrides=fields
    )
    return model, task


IMAGE = Family(
    "image",
    "image classifier",
    VISION_KINDS,
    ImageTaskConfig,
    ImageClassificationTask,
    {},
    kind_flag="--model",
    resolver=resolve_image,
    builder=build_image,
)
