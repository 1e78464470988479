"""Hugging Face DeiT <-> attnlab's :class:`~attnlab.models.vision.DeiT`: the ViT key map under
``deit.``, plus the distillation token and the two heads.

================================================================  ==============================
Hugging Face ``DeiTForImageClassificationWithTeacher``             attnlab ``DeiT``
================================================================  ==============================
``deit.embeddings.cls_token`` / ``distillation_token``              ``cls_token`` / ``dist_token``
``deit.embeddings.position_embeddings`` (1, N + 2, C)               ``pos_embed.weight``
``deit.layers.i...`` / ``deit.layernorm``                          as ViT's (:mod:`.vision`)
``cls_classifier`` / ``distillation_classifier``                   ``head`` / ``head_dist``
================================================================  ==============================

HF's ``logits`` are the mean of the two heads, as our ``forward``. ``DeiTModel`` (no heads,
optionally its pooler) reads and writes too.
"""

from __future__ import annotations

from collections.abc import Collection

from attnlab.config.vision import DeiTConfig
from attnlab.interop.hf.family import Family, model_from_state_dict, names_without
from attnlab.interop.hf.vision import vit_config_from_hf, vit_export, vit_keymap
from attnlab.interop.keymap import KeyMap, Rule
from attnlab.models.vision.deit import DeiT

__all__ = ["DEIT", "deit_keymap", "deit_config_from_hf", "deit_export", "deit_from_hf_state_dict"]

WITH_TEACHER = "DeiTForImageClassificationWithTeacher"


def deit_keymap(prefix: str = "") -> KeyMap:
    """The key map between a :class:`DeiT` and HF DeiT (``prefix`` ``deit.`` inside
    ``DeiTForImageClassificationWithTeacher``)."""
    extra = [
        Rule("dist_token", prefix + "embeddings.distillation_token"),
        Rule("head_dist.{w}", "distillation_classifier.{w}"),
    ]
    return vit_keymap(prefix, head="cls_classifier", extra=extra)


def deit_config_from_hf(cfg_dict: dict, state_dict: Collection[str] | None = None) -> DeiTConfig:
    """Our :class:`DeiTConfig` for an HF DeiT ``config.json`` dict: the ViT's translation, with
    the heads present when ``state_dict`` holds ``cls_classifier.weight`` (without names: when
    the architecture is ``DeiTForImageClassificationWithTeacher``)."""
    if state_dict is None:
        with_heads = WITH_TEACHER in (cfg_dict.get("architectures") or [])
        names: set[str] = {"classifier.weight"} if with_heads else set()
    else:  # the ViT reader looks for its head under "classifier"
        rename = {"cls_classifier.weight": "classifier.weight"}
        names = {rename.get(n, n) for n in names_without(state_dict, "deit.")}
    return DeiTConfig.from_dict(vit_config_from_hf(cfg_dict, names).to_dict())


def deit_export(model: DeiT) -> tuple[dict, KeyMap]:
    """``(config.json dict, key map)`` of a DeiT as ``DeiTForImageClassificationWithTeacher``
    (with heads, ``deit.`` prefix) or ``DeiTModel``.

    Raises:
        UserError: a setting HF DeiT has no counterpart for (as for ViT).
    """
    cfg, _ = vit_export(model)
    has_head = model.config.num_classes > 0
    cfg.update(model_type="deit", architectures=[WITH_TEACHER if has_head else "DeiTModel"])
    return cfg, deit_keymap("deit." if has_head else "")


def _keymap(hf: dict, config: DeiTConfig, names: Collection[str]) -> KeyMap:
    return deit_keymap("deit." if any(n.startswith("deit.") for n in names) else "")


DEIT = Family(
    name="deit",
    architectures=("DeiTModel", WITH_TEACHER),
    config_from_hf=deit_config_from_hf,
    build=DeiT,
    keymap=_keymap,
)


def deit_from_hf_state_dict(cfg_dict: dict, state_dict: dict) -> DeiT:
    """Our DeiT from an HF DeiT config dict and state dict.

    Raises:
        UserError: missing, unexpected or misshapen weights (the message names them).
    """
    return model_from_state_dict(DEIT, cfg_dict, state_dict)
