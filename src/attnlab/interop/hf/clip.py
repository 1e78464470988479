"""Hugging Face ``CLIPModel`` <-> :class:`attnlab.models.multimodal.clip.DualEncoder`.

One declarative key map (:func:`clip_keymap`), both directions derived from it:

=========================================================  =====================================
Hugging Face ``CLIPModel``                                 attnlab ``DualEncoder``
=========================================================  =====================================
``vision_model.embeddings.class_embedding`` ``(C,)``       ``vision.cls_token`` ``(1, 1, C)``
``vision_model.embeddings.position_embedding`` ``(T, C)``  ``vision.pos_embed.weight`` ``(1, T, C)``
``vision_model.embeddings.patch_embedding`` (no bias)      ``vision.patch_embed.proj``
``vision_model.pre_layrnorm`` / ``post_layernorm``         ``vision.embed_norm`` / ``vision.norm``
``{vision,text}_model.encoder.layers.i.self_attn.          rows of ``*.blocks.i.attn.qkv``
{q,k,v}_proj``                                             (Q | K | V)
``...self_attn.out_proj``, ``layer_norm1/2``, ``mlp.fc1/2``  ``attn.out_proj``, ``norm1/2``, ``ffn.fc1/2``
``text_model.embeddings.token_embedding`` /                ``text.tok_emb`` / ``text.pos_emb``
``position_embedding``
``text_model.final_layer_norm``                            ``text.norm_f``
``visual_projection`` / ``text_projection``                ``image_proj`` / ``text_proj``
``logit_scale``                                            ``logit_scale``
=========================================================  =====================================

HF applies ``post_layernorm`` to the class token only and attnlab's ViT ``norm`` to every token
before pooling it: the pooled feature — what is projected — is the same. What CLIP's config must
say and attnlab's carries: quick GELU (``hidden_act``), pre-LN blocks, the image tower's
``pre_layrnorm`` (``embed_norm``) and bias-free patches, the text tower's causal mask, and where it
pools: HF reads the first ``eos_token_id`` — or, when ``eos_token_id == 2`` (configs before HF PR
24773), the largest id — which is ``eos_pooling`` ``first`` / ``argmax``.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

import torch
from torch import Tensor

from attnlab.config.clip import ClipConfig, TextTowerConfig
from attnlab.config.vision import ViTConfig
from attnlab.errors import UserError
from attnlab.interop.hf.family import (
    TO_HF_ACTIVATION,
    Family,
    hf_activation,
    model_from_state_dict,
    require,
    require_plain_heads,
)
from attnlab.interop.keymap import Concat, KeyMap, LeadingOnes, Rule
from attnlab.models.multimodal.clip import DualEncoder

__all__ = [
    "CLIP",
    "clip_keymap",
    "clip_config_from_hf",
    "clip_config_to_hf",
    "clip_export",
    "clip_from_hf",
    "clip_to_hf",
]

_LEGACY_EOS = 2  # HF's eos_token_id before PR 24773: pool at the largest id instead


def _layer_rules(ours: str, theirs: str) -> list[Rule]:
    """One pre-LN encoder layer of either tower."""
    return [
        Rule(
            ours + "attn.qkv.{w}",
            tuple(f"{theirs}self_attn.{n}_proj.{{w}}" for n in "qkv"),
            Concat(dim=0),  # Q | K | V rows
        ),
        Rule(ours + "attn.out_proj.{w}", theirs + "self_attn.out_proj.{w}"),
        Rule(ours + "norm1.{w}", theirs + "layer_norm1.{w}"),
        Rule(ours + "norm2.{w}", theirs + "layer_norm2.{w}"),
        Rule(ours + "ffn.fc1.{w}", theirs + "mlp.fc1.{w}"),
        Rule(ours + "ffn.fc2.{w}", theirs + "mlp.fc2.{w}"),
    ]


def clip_keymap() -> KeyMap:
    """The key map between a :class:`DualEncoder` and HF ``CLIPModel``."""
    v, t = "vision_model.", "text_model."
    rules = [
        Rule("vision.cls_token", v + "embeddings.class_embedding", LeadingOnes(2)),
        Rule("vision.pos_embed.weight", v + "embeddings.position_embedding.weight", LeadingOnes(1)),
        Rule("vision.patch_embed.proj.weight", v + "embeddings.patch_embedding.weight"),
        Rule("vision.embed_norm.{w}", v + "pre_layrnorm.{w}"),
        *_layer_rules("vision.blocks.{i}.", v + "encoder.layers.{i}."),
        Rule("vision.norm.{w}", v + "post_layernorm.{w}"),
        Rule("text.tok_emb.weight", t + "embeddings.token_embedding.weight"),
        Rule("text.pos_emb.weight", t + "embeddings.position_embedding.weight"),
        *_layer_rules("text.blocks.{i}.", t + "encoder.layers.{i}."),
        Rule("text.norm_f.{w}", t + "final_layer_norm.{w}"),
        Rule("image_proj.weight", "visual_projection.weight"),
        Rule("text_proj.weight", "text_projection.weight"),
        Rule("logit_scale", "logit_scale"),
    ]
    # buffers some versions saved
    return KeyMap(rules, ignore_theirs=[r"\.position_ids\Z"])


def _tower(hf: dict, name: str) -> dict:
    sub = hf.get(name)
    if not isinstance(sub, dict):
        raise UserError(f"CLIP config.json lacks its {name} section")
    return sub


def clip_config_from_hf(hf: dict, names: Collection[str] = ()) -> ClipConfig:
    """The :class:`ClipConfig` of a Hugging Face ``CLIPModel`` ``config.json`` dict.

    Raises:
        UserError: a missing section or field, an activation attnlab lacks, non-square images.
    """
    vis, txt = _tower(hf, "vision_config"), _tower(hf, "text_config")
    try:
        image_size, patch = int(vis["image_size"]), int(vis["patch_size"])
        vision = ViTConfig(
            image_size=image_size,
            patch_size=patch,
            in_channels=int(vis.get("num_channels", 3)),
            num_classes=0,
            d_model=int(vis["hidden_size"]),
            n_layers=int(vis["num_hidden_layers"]),
            n_heads=int(vis["num_attention_heads"]),
            ffn_hidden=int(vis["intermediate_size"]),
            activation=hf_activation(vis.get("hidden_act", "quick_gelu"), "CLIP vision hidden_act"),
            norm_eps=float(vis.get("layer_norm_eps", 1e-5)),
            pooling="cls",
            position="learned",
            embed_norm=True,
            patch_bias=False,
            init_std=float(vis.get("initializer_range", 0.02)),
        )
        eos = int(txt.get("eos_token_id", _LEGACY_EOS))
        text = TextTowerConfig(
            vocab_size=int(txt["vocab_size"]),
            max_seq_len=int(txt["max_position_embeddings"]),
            d_model=int(txt["hidden_size"]),
            n_layers=int(txt["num_hidden_layers"]),
            n_heads=int(txt["num_attention_heads"]),
            ffn_hidden=int(txt["intermediate_size"]),
            activation=hf_activation(txt.get("hidden_act", "quick_gelu"), "CLIP text hidden_act"),
            norm_eps=float(txt.get("layer_norm_eps", 1e-5)),
            causal=True,
            eos_id=eos if eos != _LEGACY_EOS else int(txt["vocab_size"]) - 1,
            eos_pooling="argmax" if eos == _LEGACY_EOS else "first",
            pad_id=int(txt.get("pad_token_id", 0) or 0),
            init_std=float(txt.get("initializer_range", 0.02)),
        )
        return ClipConfig(
            vision=vision,
            text=text,
            projection_dim=int(hf.get("projection_dim", 512)),
            logit_scale_init=float(hf.get("logit_scale_init_value", math.log(1 / 0.07))),
        )
    except KeyError as err:
        raise UserError(f"CLIP config.json lacks the field {err}") from None


_HF_BLOCK = dict(ffn="mlp", norm="layernorm", norm_position="pre", qk_norm=None, bias=True)


def clip_config_to_hf(c: ClipConfig) -> dict[str, Any]:
    """The Hugging Face ``CLIPModel`` ``config.json`` dict of a dual encoder CLIP can express.

    Raises:
        UserError: naming the first setting HF CLIP has no counterpart for.
    """
    v, t = c.vision, c.text
    require(v, "HF CLIP's image tower", pooling="cls", position="learned", embed_norm=True)
    require(v, "HF CLIP's image tower", patch_bias=False, qkv_bias=True, **_HF_BLOCK)
    require_plain_heads(v, "HF CLIP's image tower")
    require(t, "HF CLIP's text tower", arch="transformer", causal=True, position="learned")
    require(t, "HF CLIP's text tower", linformer_k=None, **_HF_BLOCK)
    require_plain_heads(t, "HF CLIP's text tower")
    if t.eos_pooling == "argmax":
        eos = _LEGACY_EOS
    elif t.eos_id == _LEGACY_EOS:
        raise UserError(
            "HF CLIP reads eos_token_id 2 as 'pool at the largest id': a text tower that pools at "
            "the first id 2 has no counterpart (use another end-of-text id)"
        )
    else:
        eos = t.eos_id
    return {
        "architectures": ["CLIPModel"],
        "model_type": "clip",
        "projection_dim": c.projection_dim,
        "logit_scale_init_value": c.logit_scale_init,
        "vision_config": {
            "hidden_size": v.d_model,
            "intermediate_size": v.ffn_hidden,
            "num_hidden_layers": v.n_layers,
            "num_attention_heads": v.n_heads,
            "num_channels": v.in_channels,
            "image_size": v.image_size,
            "patch_size": v.patch_size,
            "hidden_act": TO_HF_ACTIVATION[v.activation],
            "layer_norm_eps": v.norm_eps,
            "attention_dropout": 0.0,
            "initializer_range": v.init_std,
            "projection_dim": c.projection_dim,
        },
        "text_config": {
            "vocab_size": t.vocab_size,
            "hidden_size": t.d_model,
            "intermediate_size": t.ffn_hidden,
            "num_hidden_layers": t.n_layers,
            "num_attention_heads": t.n_heads,
            "max_position_embeddings": t.max_seq_len,
            "hidden_act": TO_HF_ACTIVATION[t.activation],
            "layer_norm_eps": t.norm_eps,
            "attention_dropout": 0.0,
            "initializer_range": t.init_std,
            "projection_dim": c.projection_dim,
            "eos_token_id": eos,
            "pad_token_id": t.pad_id,
            "bos_token_id": 1 if eos != 1 else 0,
        },
    }


CLIP = Family(
    name="clip",
    architectures=("CLIPModel",),
    config_from_hf=clip_config_from_hf,
    build=DualEncoder,
    keymap=lambda hf, c, names: clip_keymap(),
    model_types=("clip",),
)


def clip_from_hf(
    hf: dict, weights: dict[str, Tensor], dtype: torch.dtype = torch.float32
) -> DualEncoder:
    """A :class:`DualEncoder` from a ``CLIPModel`` config.json dict and its state dict.

    Raises:
        UserError: unsupported options; missing, unexpected or misshapen tensors (named, with
            both shapes), checked before anything is loaded.
    """
    return model_from_state_dict(CLIP, hf, weights, dtype)


def clip_export(model: DualEncoder) -> tuple[dict, KeyMap]:
    """``(config.json dict, key map)`` of ``model`` as HF ``CLIPModel``.

    Raises:
        UserError: a dual encoder HF CLIP cannot express (named).
    """
    return clip_config_to_hf(model.config), clip_keymap()


def clip_to_hf(model: DualEncoder) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``(config.json dict, state dict)`` of ``model`` in ``CLIPModel``'s layout."""
    cfg, keymap = clip_export(model)
    return cfg, keymap.to_theirs(model.state_dict())
