"""Hugging Face ViT and Swin <-> attnlab's vision models: one key map each, configs both ways.

Shape legend: C width, L classes, w window, Hh heads of a Swin stage.

==========================================================  ======================================
Hugging Face (``vit.`` / ``swin.`` prefix in ...ForImage...)  attnlab
==========================================================  ======================================
ViT ``embeddings.cls_token`` / ``position_embeddings``       ``cls_token`` / ``pos_embed.weight``
``embeddings.patch_embeddings.projection``                   ``patch_embed.proj``
``layers.i.attention.{q,k,v}_proj``                          rows of ``blocks.i.attn.qkv`` (Concat)
``layers.i.attention.o_proj``, ``layernorm_before/after``    ``attn.out_proj``, ``norm1/norm2``
``layers.i.mlp.fc1/fc2``, ``layernorm``, ``pooler.dense``    ``ffn.fc1/fc2``, ``norm``, ``pooler``
``classifier``                                               ``head``
Swin ``embeddings.norm``                                     ``embed_norm``
``encoder.layers.s.blocks.j.attention...``                   ``stages.s.blocks.j.block.attn...``
``...relative_position_bias.relative_position_bias_table``   ``stages.s.blocks.j.rel_pos.table``
``encoder.layers.s.downsample`` (end of stage s)             ``stages.s.downsample``
==========================================================  ======================================

Swin's ``relative_position_index`` is derived from the window size on both sides (a buffer
transformers 5.0-5.6 saved as a weight: ignored). The names of transformers < 5.9 (what
``save_pretrained`` still writes: ``encoder.layer.i.attention.attention.query``,
``attention.self.query`` ...) are declared as renames of the current ones.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from torch import Tensor

from attnlab.config.vision import SwinConfig, ViTConfig
from attnlab.errors import UserError
from attnlab.interop.hf.family import (
    TO_HF_ACTIVATION,
    Family,
    hf_activation,
    model_from_state_dict,
    names_without,
    require,
    require_plain_heads,
)
from attnlab.interop.keymap import Concat, KeyMap, Rule
from attnlab.models.vision.swin import SwinTransformer
from attnlab.models.vision.vit import VisionTransformer

__all__ = [
    "VIT",
    "SWIN",
    "hf_num_labels",
    "vit_keymap",
    "swin_keymap",
    "vit_config_from_hf",
    "swin_config_from_hf",
    "vit_export",
    "swin_export",
    "vit_from_hf_state_dict",
    "swin_from_hf_state_dict",
    "vit_to_hf",
    "swin_to_hf",
]

_QKV = Concat(dim=0)  # (3C, C) rows Q | K | V
# older names of a block's layers (transformers < 5.9), the same in ViT and Swin
_OLD_LAYERS = {
    "intermediate.dense.{w}": "mlp.fc1.{w}",
    "output.dense.{w}": "mlp.fc2.{w}",
    "attention.output.dense.{w}": "attention.o_proj.{w}",
}


def _block_rules(ours: str, theirs: str) -> list[Rule]:
    """The rules of one pre-norm block, HF ViT/Swin layer names under ``theirs``."""
    return [
        Rule(
            ours + "attn.qkv.{w}", tuple(f"{theirs}attention.{n}_proj.{{w}}" for n in "qkv"), _QKV
        ),
        Rule(ours + "attn.out_proj.{w}", theirs + "attention.o_proj.{w}"),
        Rule(ours + "norm1.{w}", theirs + "layernorm_before.{w}"),
        Rule(ours + "norm2.{w}", theirs + "layernorm_after.{w}"),
        Rule(ours + "ffn.fc1.{w}", theirs + "mlp.fc1.{w}"),
        Rule(ours + "ffn.fc2.{w}", theirs + "mlp.fc2.{w}"),
    ]


def _prefix(names: Collection[str], prefix: str) -> str:
    """``prefix`` when the checkpoint's base model carries it (an ...ForImageClassification)."""
    return prefix if any(n.startswith(prefix) for n in names) else ""


def vit_keymap(prefix: str = "", *, head: str = "classifier", extra: Sequence[Rule] = ()) -> KeyMap:
    """The key map between a :class:`VisionTransformer` and HF ViT (``prefix`` ``vit.`` inside
    ``ViTForImageClassification``); ``head`` names HF's classifier, ``extra`` adds rules (DeiT's
    distillation token and head: :mod:`attnlab.interop.hf.deit`)."""
    p, lay = prefix, prefix + "layers.{i}."
    rules = [
        Rule("cls_token", p + "embeddings.cls_token"),
        Rule("pos_embed.weight", p + "embeddings.position_embeddings"),
        Rule("patch_embed.proj.{w}", p + "embeddings.patch_embeddings.projection.{w}"),
        *_block_rules("blocks.{i}.", lay),
        Rule("norm.{w}", p + "layernorm.{w}"),
        Rule("pooler.{w}", p + "pooler.dense.{w}"),
        Rule("head.{w}", head + ".{w}"),
        *extra,
    ]
    old = p + "encoder.layer.{i}."
    renames = {old + k: lay + v for k, v in _OLD_LAYERS.items()}
    for n, was in zip("qkv", ("query", "key", "value"), strict=True):
        renames[f"{old}attention.attention.{was}.{{w}}"] = f"{lay}attention.{n}_proj.{{w}}"
    renames[old + "{m}.{w}"] = lay + "{m}.{w}"  # layernorm_before / after kept their names
    return KeyMap(rules, renames=renames)


def swin_keymap(prefix: str = "") -> KeyMap:
    """The key map between a :class:`SwinTransformer` and HF Swin (``prefix`` ``swin.`` inside
    ``SwinForImageClassification``)."""
    p, blk = prefix, prefix + "encoder.layers.{s}.blocks.{j}."
    table = "attention.relative_position_bias.relative_position_bias_table"
    rules = [
        Rule("patch_embed.proj.{w}", p + "embeddings.patch_embeddings.projection.{w}"),
        Rule("embed_norm.{w}", p + "embeddings.norm.{w}"),
        Rule("pos_embed.weight", p + "embeddings.position_embeddings"),
        Rule("stages.{s}.blocks.{j}.rel_pos.table", blk + table),  # ((2w-1)², Hh)
        *_block_rules("stages.{s}.blocks.{j}.block.", blk),
        Rule("stages.{s}.downsample.{m}.{w}", p + "encoder.layers.{s}.downsample.{m}.{w}"),
        Rule("norm.{w}", p + "layernorm.{w}"),
        Rule("head.{w}", "classifier.{w}"),
    ]
    renames = {blk + k: blk + v for k, v in _OLD_LAYERS.items()}
    for n, was in zip("qkv", ("query", "key", "value"), strict=True):
        renames[f"{blk}attention.self.{was}.{{w}}"] = f"{blk}attention.{n}_proj.{{w}}"
    renames[blk + "attention.self.relative_position_bias_table"] = blk + table
    return KeyMap(rules, renames=renames, ignore_theirs=[r"\.relative_position_index\Z"])


# ---- config.json <-> configs --------------------------------------------------------------------


def _square(v: Any, name: str) -> int:
    if isinstance(v, (list, tuple)):
        if len(v) != 2 or v[0] != v[1]:
            raise UserError(f"only square {name} are supported, got {v}")
        v = v[0]
    return int(v)


def hf_num_labels(cfg_dict: dict) -> tuple[int, list[str]]:
    """``(num_labels, label names)`` from an HF config dict (``id2label`` or ``num_labels``)."""
    id2label = cfg_dict.get("id2label")
    if id2label:
        items = sorted(((int(k), str(v)) for k, v in id2label.items()))
        return len(items), [v for _, v in items]
    n = int(cfg_dict.get("num_labels", 2))
    return n, []


def _image_fields(
    hf: dict, names: Collection[str] | None, family: str, *, patch_size: int, norm_eps: float
) -> dict[str, Any]:
    """The config fields HF ViT and Swin configs give alike: image, head, activation, ε, Q/K/V bias.

    The head is included when ``names`` hold ``classifier.weight``; without names, when the
    architecture is ``<family>ForImageClassification``. ``patch_size`` and ``norm_eps`` are the
    family's HF defaults.
    """
    archs = hf.get("architectures") or []
    has_head = (
        "classifier.weight" in names
        if names is not None
        else f"{family}ForImageClassification" in archs
    )
    n_labels, labels = hf_num_labels(hf)
    return dict(
        image_size=_square(hf.get("image_size", 224), "images"),
        patch_size=_square(hf.get("patch_size", patch_size), "patches"),
        in_channels=int(hf.get("num_channels", 3)),
        num_classes=n_labels if has_head else 0,
        labels=labels if has_head else [],
        activation=hf_activation(hf.get("hidden_act", "gelu")),
        norm_eps=float(hf.get("layer_norm_eps", norm_eps)),
        qkv_bias=bool(hf.get("qkv_bias", True)),
    )


def vit_config_from_hf(cfg_dict: dict, state_dict: Collection[str] | None = None) -> ViTConfig:
    """Our :class:`ViTConfig` for an HF ViT ``config.json`` dict.

    The classification head and the pooler are included when ``state_dict`` (a state dict or
    its names) holds their weights (``classifier.weight``, ``pooler.dense.weight``); without
    one, a head is assumed when the architecture is ``ViTForImageClassification``.
    """
    names = None if state_dict is None else names_without(state_dict, "vit.")
    hidden = int(cfg_dict.get("hidden_size", 768))
    return ViTConfig(
        **_image_fields(cfg_dict, names, "ViT", patch_size=16, norm_eps=1e-12),
        d_model=hidden,
        n_layers=int(cfg_dict.get("num_hidden_layers", 12)),
        n_heads=int(cfg_dict.get("num_attention_heads", 12)),
        ffn_hidden=int(cfg_dict.get("intermediate_size", 4 * hidden)),
        pooling="cls",
        position="learned",
        pooler="pooler.dense.weight" in names if names is not None else False,
    )


def swin_config_from_hf(cfg_dict: dict, state_dict: Collection[str] | None = None) -> SwinConfig:
    """Our :class:`SwinConfig` for an HF Swin ``config.json`` dict (head from the state dict)."""
    names = None if state_dict is None else names_without(state_dict, "swin.")
    return SwinConfig(
        **_image_fields(cfg_dict, names, "Swin", patch_size=4, norm_eps=1e-5),
        d_model=int(cfg_dict.get("embed_dim", 96)),
        depths=list(cfg_dict.get("depths", [2, 2, 6, 2])),
        n_heads=list(cfg_dict.get("num_heads", [3, 6, 12, 24])),
        window_size=int(cfg_dict.get("window_size", 7)),
        mlp_ratio=float(cfg_dict.get("mlp_ratio", 4.0)),
        absolute_positions=bool(cfg_dict.get("use_absolute_embeddings", False)),
    )


def _hf_config(c: ViTConfig | SwinConfig, architecture: str, **fields: Any) -> dict:
    """An HF config dict: what ViT and Swin share (image, activation, norm ε, Q/K/V bias, no
    dropout, the class names of a head) plus their own ``fields``."""
    cfg = {
        "architectures": [architecture],
        "image_size": c.image_size,
        "patch_size": c.patch_size,
        "num_channels": c.in_channels,
        **fields,
        "hidden_act": TO_HF_ACTIVATION[c.activation],
        "layer_norm_eps": c.norm_eps,
        "qkv_bias": c.qkv_bias,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    }
    if c.num_classes > 0:
        names = c.labels or [f"LABEL_{i}" for i in range(c.num_classes)]
        cfg["id2label"] = {str(i): n for i, n in enumerate(names)}
        cfg["label2id"] = {n: i for i, n in enumerate(names)}
    return cfg


_HF_BLOCK = dict(ffn="mlp", norm="layernorm", norm_position="pre", qk_norm=None, bias=True)


def vit_export(model: VisionTransformer) -> tuple[dict, KeyMap]:
    """``(config.json dict, key map)`` of a ViT as ``ViTForImageClassification`` (with a head,
    ``vit.`` prefix) or ``ViTModel``.

    Raises:
        UserError: a setting HF ViT has no counterpart for (only class-token pooling with
            learned positions and a plain pre-norm block are).
    """
    c = model.config
    require(c, "HF ViT", pooling="cls", position="learned", patch_bias=True, embed_norm=False)
    require(c, "HF ViT", **_HF_BLOCK)
    require_plain_heads(c, "HF ViT")
    has_head = c.num_classes > 0
    cfg = _hf_config(
        c,
        "ViTForImageClassification" if has_head else "ViTModel",
        model_type="vit",
        hidden_size=c.d_model,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads,
        intermediate_size=c.ffn_hidden,
    )
    return cfg, vit_keymap("vit." if has_head else "")


def swin_export(model: SwinTransformer) -> tuple[dict, KeyMap]:
    """``(config.json dict, key map)`` of a Swin as ``SwinForImageClassification`` or
    ``SwinModel``.

    Raises:
        UserError: a setting HF Swin has no counterpart for (named, with the stage).
    """
    c = model.config
    require(c, "HF Swin", position="relative")
    for s in range(len(c.depths)):
        require(c.stage_block(s), f"HF Swin (stage {s})", **_HF_BLOCK)
        require_plain_heads(c.stage_block(s), f"HF Swin (stage {s})")
    has_head = c.num_classes > 0
    cfg = _hf_config(
        c,
        "SwinForImageClassification" if has_head else "SwinModel",
        model_type="swin",
        embed_dim=c.d_model,
        depths=list(c.depths),
        num_heads=list(c.n_heads),
        window_size=c.window_size,
        mlp_ratio=c.mlp_ratio,
        use_absolute_embeddings=c.absolute_positions,
        drop_path_rate=0.0,
    )
    return cfg, swin_keymap("swin." if has_head else "")


# ---- the families and the state-dict functions -------------------------------------------------


def _image_family(name: str, hf_name: str, config_from_hf, build, keymap) -> Family:
    """A vision family: HF's ``<hf_name>Model`` (weights under ``<name>.`` or bare) and
    ``<hf_name>ForImageClassification`` (weights under ``<name>.``, the classifier beside)."""
    return Family(
        name=name,
        architectures=(f"{hf_name}Model", f"{hf_name}ForImageClassification"),
        config_from_hf=config_from_hf,
        build=build,
        keymap=lambda hf, c, names: keymap(_prefix(names, f"{name}.")),
    )


VIT = _image_family("vit", "ViT", vit_config_from_hf, VisionTransformer, vit_keymap)
SWIN = _image_family("swin", "Swin", swin_config_from_hf, SwinTransformer, swin_keymap)


def vit_from_hf_state_dict(cfg_dict: dict, state_dict: dict[str, Tensor]) -> VisionTransformer:
    """Our ViT from an HF ViT config dict and state dict (ViTModel / ViTForImageClassification).

    Raises:
        UserError: missing, unexpected or misshapen weights (the message names them).
    """
    return model_from_state_dict(VIT, cfg_dict, state_dict)


def swin_from_hf_state_dict(cfg_dict: dict, state_dict: dict[str, Tensor]) -> SwinTransformer:
    """Our Swin from an HF Swin config dict and state dict (SwinModel / ...ForImageClassification).

    Raises:
        UserError: missing, unexpected or misshapen weights (the message names them).
    """
    return model_from_state_dict(SWIN, cfg_dict, state_dict)


def vit_to_hf(model: VisionTransformer) -> tuple[dict, dict[str, Tensor]]:
    """``(config dict, state dict)`` in the layout of HF ViT (transformers >= 5.9 names)."""
    cfg, keymap = vit_export(model)
    return cfg, keymap.to_theirs(model.state_dict())


def swin_to_hf(model: SwinTransformer) -> tuple[dict, dict[str, Tensor]]:
    """``(config dict, state dict)`` in HF Swin's layout (transformers >= 5.9 names)."""
    cfg, keymap = swin_export(model)
    return cfg, keymap.to_theirs(model.state_dict())
